"""The simulator's hardware and model presets: the published bidirectional benchmark's setup.

The published runs (vLLM blog, 2026-10-12, and its repro scripts) served each model with tensor
parallel 8 on one p5en.48xlarge (8x H200) per role, ``--max-num-seqs 8``, NIXL's LIBFABRIC backend
over EFA with each GPU's KV registered on the two 200 Gb/s links beside its PCIe switch.  Every
preset here is that machine and that configuration; every number is a public figure (sources
below) that is *not* a result of the bidirectional benchmark, and none is fitted to its TTFT,
prefill or transfer times (those are the check).  Figures marked (to verify) are quoted from the
source as remembered, not re-read for this version.

Presets (``tp`` = GPUs per worker = tensor-parallel size; all 8, ``max_num_seqs`` 8):

- ``qwen3-32b``: Qwen3-32B, BF16 weights and KV; KV heads (8) split over the 8 ranks (1 each).
- ``glm5-fp8``: GLM-5-FP8, FP8 weights, MLA + DeepSeek sparse attention (DSA), MoE; the MLA latent
  is one "head", so every rank holds (and transfers) the whole KV; experts are tensor-parallel
  sharded (vLLM's default without ``--enable-expert-parallel``).
- ``llama-3.3-70b``: Llama-3.3-70B-Instruct, BF16; 8 KV heads over 8 ranks (1 each).

Sources:

- H200 SXM (NVIDIA H200 Tensor Core GPU datasheet): 4.8 TB/s HBM3e; dense 989.5 TFLOPS BF16 and
  1,979 TFLOPS FP8 (the datasheet's "with sparsity" 1,979 / 3,958 halved); NVLink 900 GB/s per GPU
  (both directions: 450 GB/s each way).
- NCCL all-reduce on 8 GPUs over NVSwitch: nccl-tests ``all_reduce_perf`` bus bandwidth 460-480
  GB/s at large sizes on 8x H100 SXM (the same NVLink 4 / NVSwitch as an H200 node; Alaya NeW,
  "NCCL-tests in practice", 2026; busbw as nccl-tests' PERFORMANCE.md defines it: time = 2(n-1)/n
  x bytes / busbw) -> :data:`NCCL_BUSBW` 470 GB/s.  Per-call latency :data:`ALLREDUCE_LATENCY_S`
  10 us (nccl-tests small-message all-reduce time on one NVSwitch node; to verify).
- p5en (AWS EC2 P5en page): 8x H200, 16 x 200 Gb/s EFAv3 = 3,200 Gb/s per instance; NIXL's
  LIBFABRIC backend (ai-dynamo/nixl PR #784, topology-aware rails) registers each GPU on the two
  EFA devices beside its PCIe switch: 2 x 200 Gb/s = 50 GB/s per GPU, and round-robins descriptors
  over those rails (nixl PR #1924: EFA posts one descriptor per rail in turn, no FI_MORE batching).
- EFA per-message cost: ``fi_rdm_tagged_bw -p efa`` 1.78 us per 4 KiB transfer on one endpoint,
  message-rate bound (0.56 M transfers/s; ofiwg/libfabric issue #5694, c5n EFA: an older EFA than
  p5en's EFAv3, so likely pessimistic; to verify on p5en) -> :data:`EFA_DESCRIPTOR_S` per
  descriptor per rail.  Per-request overhead: one notification round trip, ~25-30 us per small
  message (``fi_pingpong -p efa`` usec/xfer, ComputeCanada/puppet-magic_castle PR #331), 2 of them
  -> :data:`EFA_REQUEST_S` 60 us.
- Descriptor count: vLLM's NIXL connector registers one region per layer per KV tensor on each rank
  (K and V separately for standard attention; one latent tensor per layer for MLA, plus DSA's
  indexer-key cache) and reads one descriptor per block per region: blocks x layers x regions per
  GPU, every GPU in parallel over its own rails.
- Kernel efficiency (fraction of dense peak reached by the kernels, not a whole-system MFU):
  attention 0.65: FlashAttention-3 (Shah et al., 2024, arXiv 2407.08608) BF16 causal forward,
  head dim 128, long sequences, ~640 of 989.5 TFLOPS on H100 (to verify); FlashMLA's sparse
  (DSA) prefill kernel, up to 640 TFLOPS on H800 SXM5 (deepseek-ai/FlashMLA README; to verify).
  Dense BF16 GEMMs 0.7: cuBLAS BF16 GEMM on H100 SXM at prefill shapes, ~700 TFLOPS (to verify).
  Dense FP8 GEMMs 0.62 (GLM-5's attention projections, dense layers, shared expert, router, LM
  head): DeepGEMM's normal FP8 GEMM up to 1,358 TFLOPS on H800 at 4096 x 7168 x 16384 (0.69 of
  peak; deepseek-ai/DeepGEMM README, re-read); our H200 ``torch._scaled_mm`` at a rank's 8,192 x
  6,144 x 2,048 shapes, 0.60-0.63 (docs/benchmarks.md, "H200"; 0.33 at 1,024 rows, not modelled).
- GLM-5's routed experts (:mod:`kvtrace.sim.moe_cost`): no single efficiency, a curve of achieved
  FLOP/s against rows per expert, :data:`VLLM_MOE_H200_MS`: vLLM 0.32's Triton ``fused_moe_kernel``
  with the tuned config vLLM ships (``E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,
  block_shape=[128,128]``), one GLM-5-FP8 MoE layer per rank at TP 8 (gate_up 6,144 -> 512, down
  256 -> 6,144), measured on an H200 (benchmarks/sim/gpu_vllm_moe.py, docs/benchmarks.md "H200"):
  0.017 of FP8 peak at 5 rows per expert, 0.072 at 32, 0.176 at 256 (an 8,192-token chunk).
  Independent public figure (not used): DeepGEMM README's masked grouped GEMM on H800, 815-932
  TFLOPS (0.41-0.47 of peak) at 256 rows per expert and 916-1,040 at 512, contiguous 1,093-1,297
  at 4-8k rows; those are DeepSeek-V3's whole experts (N 4,096 / 7,168, expert parallel), not TP
  8's 256-wide slices.  The preset uses ours: it is the kernel and the shape vLLM runs for this
  preset's configuration (TP 8, no expert parallelism), and its small-rows points are exactly
  what DeepGEMM's table lacks.  Below the curve's first point and as a floor: the touched experts'
  weight slices read once per chunk at HBM bandwidth.
- GLM-5's attention at TP 8 (vLLM 0.32, vllm/v1/attention/backends/mla/flashmla_sparse.py): 64
  heads / 8 ranks = 8 per rank, under ``MIN_HEADS_FOR_BF16_PREFILL`` (32), so prefill tokens run
  the FP8 sparse *decode* kernel ("mixed batch mode"), whose heads are padded to 64
  (``_compute_fp8_decode_padded_heads``): every rank computes 64 heads' FLOPs for its 8
  (:attr:`Preset.attn_pad` 8).  That kernel's rate: FlashMLA README, sparse decoding with FP8 KV
  cache 410 TFLOPS on H800 (compute bound) -> :data:`FLASHMLA_SPARSE_DECODE_EFF` 410 / 989.5.
  Except a prompt no longer than index_topk (2,048): vLLM runs it as dense MHA
  (``_use_dense_mha_prefill`` in vllm/model_executor/layers/attention/sparse_mla_attention.py:
  ``prefill_max_seq_len <= topk_tokens``), the rank's own 8 heads un-absorbed (q/k 192 + 64, v
  256: 78 x 64 x 2 x (256 + 256) FLOPs per pair) on FlashAttention at :data:`ATTN_EFF`.
  The DSA indexer is not tensor-parallel ("no tensor parallel, just replicated": ``Indexer`` in
  vllm/model_executor/models/deepseek_v2.py): every rank scores all 32 indexer heads
  (:attr:`Preset.index_sharded` False), at the former attention efficiency 0.65 of BF16 (its
  FP8 logits kernel, DeepGEMM ``fp8_mqa_logits``, has no public efficiency figure; to verify).
  Cross-check (not used to set anything): SGLang's DeepSeek-V3 prefill, 52.3k input tokens/s per
  8x H100 node at 2,000-token inputs (LMSYS blog, 2025-05-05, large-scale EP).
- Chunked prefill: vLLM's default ``max_num_batched_tokens`` for the API server on >= 70 GiB GPUs,
  8,192 (vllm/engine/arg_utils.py; to verify): a prefill of n tokens is ceil(n / 8192) forward
  passes, each reading every weight (all experts) once.
- Qwen3-32B (Qwen/Qwen3-32B config.json): 32.8 B parameters, 64 layers, hidden 5120, 64 query
  heads, 8 KV heads, head_dim 128.  KV/token 64 x 8 x 128 x 2 (K, V) x 2 B = 262,144 B.  Attention
  FLOPs per (query, key) pair: 64 layers x 64 heads x 128 x 2 (QK, AV) x 2.
- GLM-5 (zai-org/GLM-5 model card; config.json of the GLM-5 family, GlmMoeDsaForCausalLM): 744 B
  parameters, 40 B active, 78 layers (first_k_dense_replace 3: 3 dense, 75 MoE), hidden 6144,
  n_routed_experts 256, num_experts_per_tok 8, moe_intermediate_size 2,048 (one routed expert:
  gate, up, down = 3 x 6,144 x 2,048 = 37.7 M parameters, 1 B each in FP8; routed active per token
  75 x 8 x 37.7 M = 22.6 B, the other 17.4 B of the 40 B at the dense efficiency; a count from the
  config gives 744 B total and 18.2 B non-routed GEMM parameters, within 5 % of that), MLA
  (kv_lora_rank 512 + qk_rope_head_dim 64; q_lora_rank 2,048, qk_nope_head_dim 192, v_head_dim
  256), 64 heads, DSA index_topk 2,048 with an indexer of index_n_heads 32 x index_head_dim 128
  (re-read for this version: the GLM-5 config.json defaults in jd-opensource/xllm
  xllm/models/llm/glm5.h, which cite huggingface.co/zai-org/GLM-5/blob/main/config.json).
  KV/token in vLLM's fp8_ds_mla layout: 78 x (656 B latent: 512 FP8 + 4 x 4 B scales + 64 BF16
  RoPE; + 132 B indexer key: 128 FP8 + a 4 B scale) = 61,464 B.  MLA pair FLOPs (absorbed): 78 x
  64 x 2 x (576 + 512); indexer 78 x 32 x 128 x 2.
- KV block size: 16 tokens, vLLM's default on CUDA, except GLM-5: DSA runs on vLLM's FLASHMLA_SPARSE
  backend, whose kernels take 64-token blocks only (``get_supported_kernel_block_sizes() -> [64]`` in
  vllm/v1/attention/backends/mla/flashmla_sparse.py), so its NIXL descriptors carry 64 tokens each.
- Llama-3.3-70B (meta-llama/Llama-3.3-70B-Instruct config.json): 70.6 B parameters, 80 layers,
  hidden 8192, 64 query heads, 8 KV heads, head_dim 128.  KV/token 80 x 8 x 128 x 2 x 2 B = 327,680 B.

Links: ``efa-3200`` (per GPU 50 GB/s, 2 rails, the EFA costs above), ``tcp-100`` (one 100 Gb/s NIC
= 12.5 GB/s shared by the worker's GPUs, 5 ms per transfer, no per-descriptor cost).
"""

from __future__ import annotations

from dataclasses import dataclass

H200_HBM = 4.8e12  # B/s
H200_BF16 = 989.5e12  # FLOP/s dense
H200_FP8 = 1979e12  # FLOP/s dense
NCCL_BUSBW = 470e9  # B/s, all-reduce bus bandwidth on one 8-GPU NVSwitch node
ALLREDUCE_LATENCY_S = 10e-6  # per all-reduce call
ATTN_EFF = 0.65  # FlashAttention-3 / FlashMLA prefill kernels, fraction of BF16 peak
GEMM_EFF_BF16 = 0.7  # cuBLAS BF16 GEMMs
GEMM_EFF_FP8_MOE = 0.62  # FP8 GEMMs outside the routed experts (DeepGEMM dense; our H200 _scaled_mm)
FLASHMLA_SPARSE_DECODE_EFF = 410 / 989.5  # FlashMLA's FP8 sparse decode kernel, 410 TFLOPS on H800
# vLLM 0.32's fused_moe_kernel on an H200, one GLM-5-FP8 MoE layer per rank at TP 8: (tokens in the
# chunk, seconds per layer), medians of benchmarks/sim/gpu_vllm_moe.py (docs/benchmarks.md, "H200")
VLLM_MOE_H200_MS = (
    (1, 0.168e-3),
    (8, 0.127e-3),
    (64, 0.312e-3),
    (160, 0.368e-3),
    (512, 0.479e-3),
    (1024, 0.541e-3),
    (2048, 0.693e-3),
    (4096, 1.056e-3),
    (8192, 1.778e-3),
)
CHUNK_TOKENS = 8192  # vLLM's max_num_batched_tokens (API server, >= 70 GiB GPUs)
EFA_GPU_BYTES_PER_S = 2 * 200e9 / 8  # two 200 Gb/s EFA devices per GPU
EFA_DESCRIPTOR_S = 1.78e-6  # per descriptor per rail (message-rate bound)
EFA_REQUEST_S = 60e-6  # per KV load: notification round trips


@dataclass(frozen=True)
class Preset:
    name: str
    bytes_per_token: int  # KV bytes per token (one copy of the model's KV)
    active_params: float  # parameters used per token (GEMM FLOPs = 2 x this)
    weight_bytes: float  # all weights (a prefill forward reads every expert)
    active_weight_bytes: float  # weights a decode step reads (batch 1: the active parameters)
    attn_flops_per_pair: float  # attention FLOPs per (query, key) pair, all layers
    gpus: int = 1  # GPUs per worker = tensor-parallel size
    hbm_bytes_per_s: float = H200_HBM  # per GPU
    gemm_flops_per_s: float = H200_BF16  # per GPU, the weights' dtype
    attn_flops_per_s: float = H200_BF16  # per GPU
    attn_window: int | None = None  # keys a query attends to at most (sparse attention top-k)
    index_flops_per_pair: float = 0.0  # sparse attention's indexer, every (query, key) pair
    gemm_eff: float = GEMM_EFF_BF16  # kernel efficiency of the GEMMs
    attn_eff: float = ATTN_EFF  # kernel efficiency of attention (and the indexer)
    layers: int = 0
    hidden: int = 0  # hidden size: the all-reduced activation per token is hidden x act_bytes
    act_bytes: int = 2  # BF16 activations
    allreduces_per_layer: int = 2  # after attention and after the MLP / MoE (row-parallel outputs)
    nvlink_bytes_per_s: float = NCCL_BUSBW
    allreduce_latency_s: float = ALLREDUCE_LATENCY_S
    moe_layers: int = 0
    experts_per_token: int = 0
    kv_regions_per_layer: int = 2  # NIXL regions per layer per rank: K and V (MLA: latent [+ indexer])
    kv_sharded: bool = True  # KV heads split over the ranks (False: MLA, every rank holds it all)
    max_num_seqs: int | None = None  # vLLM --max-num-seqs (recorded; the sim does not bound batches)
    chunk_tokens: int = CHUNK_TOKENS
    block_size: int = 16  # tokens per KV block: vLLM's default on CUDA, or what the attention backend requires
    # routed experts timed by a measured curve (kvtrace.sim.moe_cost); empty: every GEMM at gemm_eff
    moe_curve: tuple[tuple[float, float], ...] = ()  # (rows per expert, FLOP/s per GPU), rows ascending
    routed_experts: int = 0  # n_routed_experts
    expert_params: float = 0.0  # parameters of one routed expert (gate, up, down)
    expert_bytes: float = 0.0  # its weights' bytes (a rank reads 1/tp of them)
    moe_combine_passes: int = 2  # passes over the top-k outputs outside the GEMMs (write + read back)
    attn_pad: float = 1.0  # heads the attention kernel computes per rank / the rank's real heads
    index_sharded: bool = True  # DSA indexer split over the ranks (False: replicated on every rank)
    index_eff: float = ATTN_EFF  # kernel efficiency of the indexer
    mha_flops_per_pair: float = 0.0  # prompts of <= attn_window tokens run as dense MHA (0: never)
    mha_eff: float = ATTN_EFF  # kernel efficiency of that dense MHA (no head padding)

    @property
    def tp(self) -> int:
        return self.gpus


@dataclass(frozen=True)
class Link:
    name: str
    bytes_per_s: float  # per GPU when per_gpu, else for the whole worker
    overhead_s: float  # per KV load (one request's transfer)
    per_gpu: bool = False  # True: every GPU has bytes_per_s of its own (NIXL rails per GPU)
    descriptor_s: float = 0.0  # per descriptor per rail
    rails: int = 1  # links each GPU spreads its descriptors over


_QWEN3_32B = 32.8e9
_GLM5, _GLM5_ACTIVE = 744e9, 40e9
_LLAMA_70B = 70.6e9
_GLM5_EXPERT = 3 * 6144 * 2048  # gate, up, down projections of one routed expert
_P5EN = dict(gpus=8, max_num_seqs=8)


def moe_curve(points: tuple[tuple[int, float], ...], experts: int, top_k: int, expert_params: float, tp: int):
    """(tokens, seconds per layer) measurements -> (rows per expert, FLOP/s per GPU)."""
    return tuple((t * top_k / experts, t * top_k * 2 * expert_params / tp / s) for t, s in points)


PRESETS: dict[str, Preset] = {
    "qwen3-32b": Preset(
        "qwen3-32b",
        bytes_per_token=64 * 8 * 128 * 2 * 2,
        active_params=_QWEN3_32B,
        weight_bytes=2 * _QWEN3_32B,
        active_weight_bytes=2 * _QWEN3_32B,
        attn_flops_per_pair=64 * 64 * 128 * 2 * 2,
        layers=64,
        hidden=5120,
        **_P5EN,
    ),
    "glm5-fp8": Preset(
        "glm5-fp8",
        bytes_per_token=78 * (656 + 132),
        active_params=_GLM5_ACTIVE,
        weight_bytes=_GLM5,
        active_weight_bytes=_GLM5_ACTIVE,
        attn_flops_per_pair=78 * 64 * 2 * (576 + 512),
        gemm_flops_per_s=H200_FP8,
        gemm_eff=GEMM_EFF_FP8_MOE,
        attn_window=2048,
        index_flops_per_pair=78 * 32 * 128 * 2,
        layers=78,
        hidden=6144,
        moe_layers=75,
        experts_per_token=8,
        kv_regions_per_layer=2,  # MLA latent + DSA indexer keys
        kv_sharded=False,
        block_size=64,  # FlashMLASparseBackend.get_supported_kernel_block_sizes() == [64]
        moe_curve=moe_curve(VLLM_MOE_H200_MS, 256, 8, _GLM5_EXPERT, 8),
        routed_experts=256,
        expert_params=_GLM5_EXPERT,
        expert_bytes=_GLM5_EXPERT,  # FP8 (the 128 x 128 block scales: 1/16,384 more, ignored)
        moe_combine_passes=1,  # the measured down GEMM writes the top-k outputs; only the read back is left
        attn_eff=FLASHMLA_SPARSE_DECODE_EFF,  # 8 heads per rank < 32: vLLM runs the FP8 decode kernel
        attn_pad=64 / 8,  # ... padded to 64 heads
        index_sharded=False,  # vLLM's Indexer is replicated, not tensor-parallel
        index_eff=ATTN_EFF,
        mha_flops_per_pair=78 * 64 * 2 * (256 + 256),  # <= 2,048-token prompts: dense MHA, un-absorbed
        **_P5EN,
    ),
    "llama-3.3-70b": Preset(
        "llama-3.3-70b",
        bytes_per_token=80 * 8 * 128 * 2 * 2,
        active_params=_LLAMA_70B,
        weight_bytes=2 * _LLAMA_70B,
        active_weight_bytes=2 * _LLAMA_70B,
        attn_flops_per_pair=80 * 64 * 128 * 2 * 2,
        layers=80,
        hidden=8192,
        **_P5EN,
    ),
}
LINKS: dict[str, Link] = {
    "efa-3200": Link(
        "efa-3200", EFA_GPU_BYTES_PER_S, EFA_REQUEST_S, per_gpu=True, descriptor_s=EFA_DESCRIPTOR_S, rails=2
    ),
    "tcp-100": Link("tcp-100", 100e9 / 8, 0.005),
}
