"""Helpers for the vLLM tests: a tiny model directory and vLLM scheduler objects.

Imported only by tests that already called ``require_vllm()``.  The model has random weights
(vLLM ``--load-format dummy``); only its shapes matter: Llama, hidden 128, 2 layers, 4 heads,
2 KV heads, head_dim 32 (CPU attention needs head_dim in {32, 64, ...}), vocab 512.

:func:`make_sharp_model` is the same model with seeded weights on disk, for tests whose assertions
are on the *answer*: vLLM's dummy weights are uniform in +-1e-3 (norms included), so every logit is
nearly equal and the output hardly depends on the context; these are Gaussian at 3x the usual
1/sqrt(fan-in) scale with unit norms, so attention is peaked and a greedy answer changes when the
KV it attends to changes.
"""

from __future__ import annotations

import json
from itertools import count
from pathlib import Path

MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 512,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 0,
    "tie_word_embeddings": False,
}
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
# bytes of one KV block of this model on CPU: 2 (K,V) x block 128 x 2 kv heads x 32 x 2 B x 2 layers
CPU_BLOCK_SIZE = 128
BLOCK_BYTES = 2 * CPU_BLOCK_SIZE * 2 * 32 * 2 * 2


def make_tiny_model(directory: Path) -> Path:
    """config.json, a byte-level BPE tokenizer trained here (vocab padded to 512) and a chat
    template.  Idempotent."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    directory.mkdir(parents=True, exist_ok=True)
    if (directory / "tokenizer.json").exists():
        return directory
    (directory / "config.json").write_text(json.dumps(MODEL_CONFIG))
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|begin|>", "<|user|>", "<|assistant|>", "<|system|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=MODEL_CONFIG["vocab_size"],
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [f"turn {i}: the agent reads file {i} and calls tool number {i * 7} again." for i in range(400)]
    tok.train_from_iterator(corpus, trainer)
    while tok.get_vocab_size() < MODEL_CONFIG["vocab_size"]:
        tok.add_tokens([f"<|pad{tok.get_vocab_size()}|>"])
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": "<|endoftext|>",
                "bos_token": "<|begin|>",
                "pad_token": "<|endoftext|>",
                "model_max_length": 4096,
                "chat_template": CHAT_TEMPLATE,
            }
        )
    )
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": 0, "bos_token_id": 1}))
    return directory


SHARP_SEED = 26
SHARP_SCALE = 3.0  # x 1/sqrt(fan-in); 1.0 was too flat to change a greedy answer on wrong KV (checked offline)


def make_sharp_model(directory: Path) -> Path:
    """:func:`make_tiny_model` plus ``model.safetensors``: seeded float32 weights (see the module
    doc).  Load with ``--load-format safetensors --dtype float32``: float32 keeps the KV P pulls
    and the KV a cold prefill computes equal to far below a greedy choice.  Idempotent."""
    import torch
    from safetensors.torch import save_file

    make_tiny_model(directory)
    path = directory / "model.safetensors"
    if path.exists():
        return directory
    c = MODEL_CONFIG
    h, inter, hd = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    heads, kv = c["num_attention_heads"], c["num_key_value_heads"]
    shapes = {"model.embed_tokens.weight": (c["vocab_size"], h), "lm_head.weight": (c["vocab_size"], h)}
    for i in range(c["num_hidden_layers"]):
        pre = f"model.layers.{i}."
        shapes |= {
            pre + "self_attn.q_proj.weight": (heads * hd, h),
            pre + "self_attn.k_proj.weight": (kv * hd, h),
            pre + "self_attn.v_proj.weight": (kv * hd, h),
            pre + "self_attn.o_proj.weight": (h, heads * hd),
            pre + "mlp.gate_proj.weight": (inter, h),
            pre + "mlp.up_proj.weight": (inter, h),
            pre + "mlp.down_proj.weight": (h, inter),
        }
    gen = torch.Generator().manual_seed(SHARP_SEED)
    tensors = {}
    for name, shape in shapes.items():
        w = torch.randn(shape, generator=gen)
        tensors[name] = w if "embed" in name else w * (SHARP_SCALE / shape[1] ** 0.5)
    norms = ("input_layernorm", "post_attention_layernorm")
    names = [f"model.layers.{i}.{n}.weight" for i in range(c["num_hidden_layers"]) for n in norms]
    for name in [*names, "model.norm.weight"]:
        tensors[name] = torch.ones(h)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    (directory / "config.json").write_text(json.dumps({**MODEL_CONFIG, "torch_dtype": "float32"}))
    return directory


# ---------------------------------------------------------------------------- scheduler objects
def vllm_config(
    model_dir: Path,
    *,
    extra: dict,
    kv_role: str = "kv_both",
    block_size: int = 16,
    connector: str = "KVTraceNixlConnector",
    module_path: str | None = "kvtrace.vllm.connector",
    engine_id: str = "engine-under-test",
):
    """A VllmConfig for a scheduler-only test (CPU device, prefix caching on)."""
    from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, SchedulerConfig, VllmConfig

    model_config = ModelConfig(model=str(model_dir), dtype="bfloat16", seed=0, max_model_len=4096)
    return VllmConfig(
        model_config=model_config,
        scheduler_config=SchedulerConfig(
            max_num_seqs=16,
            max_num_batched_tokens=4096,
            max_model_len=4096,
            is_encoder_decoder=False,
            enable_chunked_prefill=True,
        ),
        cache_config=CacheConfig(block_size=block_size, enable_prefix_caching=True),
        kv_transfer_config=KVTransferConfig(
            kv_connector=connector,
            kv_connector_module_path=module_path,
            kv_role=kv_role,
            engine_id=engine_id,
            kv_connector_extra_config=extra,
        ),
        device_config=DeviceConfig("cpu"),
    )


def kv_cache_config(block_size: int = 16, num_blocks: int = 1000):
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=2, head_size=32, dtype=torch.bfloat16)
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"], spec)],
    )


def scheduler(config, *, num_blocks: int = 1000):
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager

    block_size = config.cache_config.block_size
    config.cache_config.num_gpu_blocks = num_blocks
    return Scheduler(
        vllm_config=config,
        kv_cache_config=kv_cache_config(block_size, num_blocks),
        log_stats=True,
        structured_output_manager=StructuredOutputManager(config),
        block_size=block_size,
    )


_ids = count(1)
_hash_ready = False


def request(
    prompt: list[int],
    *,
    params: dict | None = None,
    max_tokens: int = 4,
    block_size: int = 16,
    request_id: str | None = None,
    trace_headers: dict | None = None,
):
    """A v1 Request as the engine core builds it (internal id = chatcmpl-<X>-<8 chars>)."""
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    global _hash_ready
    if not _hash_ready:
        init_none_hash(sha256)
        _hash_ready = True
    sampling = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    sampling.update_from_generation_config({}, 0)
    req = Request(
        request_id=request_id or f"chatcmpl-x{next(_ids)}-abcd1234",
        prompt_token_ids=list(prompt),
        sampling_params=sampling,
        pooling_params=None,
        mm_features=None,
        block_hasher=get_request_block_hasher(block_size, sha256),
        trace_headers=trace_headers,
    )
    req.kv_transfer_params = params
    return req


def runner_output(
    reqs,
    *,
    finished_sending=None,
    finished_recving=None,
    failed_recving=None,
    invalid_block_ids=None,
    stats=None,
    token_id: int = 7,
):
    """A ModelRunnerOutput with one sampled token per running request and connector output."""
    from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

    connector = None
    if any(x is not None for x in (finished_sending, finished_recving, failed_recving, invalid_block_ids, stats)):
        connector = KVConnectorOutput(
            finished_sending=finished_sending,
            finished_recving=finished_recving,
            invalid_block_ids=invalid_block_ids or set(),
            failed_recving=failed_recving or set(),
            kv_connector_stats=stats,
        )
    ids = [r.request_id for r in reqs]
    return ModelRunnerOutput(
        req_ids=ids,
        req_id_to_index={rid: i for i, rid in enumerate(ids)},
        sampled_token_ids=[[token_id] for _ in ids],
        logprobs=None,
        prompt_logprobs_dict={},
        pooler_output=None,
        kv_connector_output=connector,
    )
