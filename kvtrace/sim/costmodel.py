"""How long simulated work takes.  All results are in *simulated* seconds.

The engine (:mod:`kvtrace.sim.engine`) asks this module for durations and sleeps
``simulated / time_scale`` wall seconds, so a ``time_scale`` of 10 replays a 10-minute session in
one minute; with ``enabled=False`` (``--no-cost``) every duration is 0 and the engine never
sleeps.  Span durations are wall time: multiply by the ``kvtrace.sim.time_scale`` resource
attribute to read them in simulated time (TTLs and lease durations are configured in simulated
seconds and compressed the same way).

Every preset number is a public hardware or model figure (sources below) or one of the two stated
assumptions (:data:`MFU`, :data:`TRANSFER_OVERHEAD_S`); none is fitted to a measured latency or a
published speedup.  Per worker (``gpus`` GPUs, tensor parallel; TP communication is not modelled):

- prefill of ``new`` tokens of a ``ctx``-token prompt (roofline: the larger of compute and one
  read of all weights)::

      t = max(weight_bytes / (gpus * hbm),
              (new * 2 * active_params) / (gpus * gemm_peak * MFU)
              + (pairs * attn_flops_per_pair + all_pairs * index_flops_per_pair) / (gpus * attn_peak * MFU))

  ``pairs`` = (query, key) pairs of causal attention over the new tokens (each new token sees the
  tokens before it, at most ``attn_window`` of them: DeepSeek sparse attention's top-k), ``all_pairs``
  the same without the window (DSA's indexer scores every key);
- decode step (continuous batching; every running decode on the worker shares one step), memory
  bound: ``t = (active_weight_bytes + sum(ctx_i) * bytes_per_token) / (gpus * hbm)``;
- transfer: ``t = TRANSFER_OVERHEAD_S + B / (link share)``, the link share of a worker being
  ``link.bytes_per_s * gpus / link.gpus`` (a p5en's 3200 Gb/s EFA serves its 8 GPUs).

Queueing: prefills on one worker run one at a time (FIFO), decodes share steps.

Presets (the published bidirectional benchmark ran on p5en, 8x H200 with 3200 Gb/s EFA; both
presets use that machine):

- ``qwen3-32b``: Qwen3-32B in BF16 on one H200.
- ``glm5-fp8``: GLM-5-FP8 on eight H200 (its 744 GB of FP8 weights need six or more; vLLM's
  recipe serves it with tensor parallel 8).

Sources:

- H200 SXM (NVIDIA H200 Tensor Core GPU datasheet): 4.8 TB/s HBM3e; dense tensor throughput
  989.5 TFLOPS BF16 and 1,979 TFLOPS FP8 (the datasheet's 1,979 / 3,958 "with sparsity", halved).
- p5en (AWS EC2 P5en instance page): 8x H200, 3,200 Gbps EFAv3 networking per instance.
- Qwen3-32B (Qwen/Qwen3-32B model card and config.json): 32.8 B parameters, BF16; 64 layers,
  64 query heads, 8 KV heads, head_dim 128.  KV per token: 64 x 8 x 128 x 2 (K, V) x 2 B =
  262,144 B.  Attention FLOPs per (query, key) pair: 64 layers x 64 heads x 128 x 2 (QK, AV) x 2.
- GLM-5 (zai-org/GLM-5 model card; its config.json, architecture GlmMoeDsaForCausalLM): 744 B
  parameters, 40 B active per token, 78 layers, 64 attention heads, MLA with kv_lora_rank 512 and
  qk_rope_head_dim 64 (576 cached values per layer), DeepSeek sparse attention: each query
  attends to the index_topk 2,048 keys an indexer of index_n_heads 32 x index_head_dim 128 picks.
  FP8 weights: 1 B per parameter.  KV per token in vLLM's fp8_ds_mla layout: 78 x 656 B (512
  FP8 latent + 4 x 4 B scales + 64 BF16 RoPE) = 51,168 B.  MLA attention FLOPs per pair
  (absorbed: scores over 576 values, the weighted sum over 512): 78 x 64 heads x 2 x (576 + 512);
  indexer: 78 x 32 x 128 x 2.

Assumptions (stated, not measured here and not fitted): :data:`MFU` 0.5 of dense peak in prefill
(GEMMs and attention alike); :data:`TRANSFER_OVERHEAD_S` 1 ms per KV load (one NIXL read round:
descriptor post and completion notification).  Links: ``efa-3200`` (3200 Gb/s = 400e9 B/s per
8-GPU instance), ``tcp-100`` (100 Gb/s = 12.5e9 B/s per worker, 5 ms per transfer).
"""

from __future__ import annotations

from dataclasses import dataclass

MFU = 0.5  # assumed model-FLOPs utilisation of prefill
TRANSFER_OVERHEAD_S = 0.001  # assumed fixed cost of one KV load over EFA
H200_HBM = 4.8e12  # B/s
H200_BF16 = 989.5e12  # FLOP/s dense
H200_FP8 = 1979e12  # FLOP/s dense


@dataclass(frozen=True)
class Preset:
    name: str
    bytes_per_token: int  # KV bytes per token
    active_params: float  # parameters used per token (GEMM FLOPs = 2 x this)
    weight_bytes: float  # all weights (a prefill forward reads every expert)
    active_weight_bytes: float  # weights a decode step reads (batch 1: the active parameters)
    attn_flops_per_pair: float  # attention FLOPs per (query, key) pair, all layers
    gpus: int = 1
    hbm_bytes_per_s: float = H200_HBM  # per GPU
    gemm_flops_per_s: float = H200_BF16  # per GPU, the weights' dtype
    attn_flops_per_s: float = H200_BF16  # per GPU
    attn_window: int | None = None  # keys a query attends to at most (sparse attention top-k)
    index_flops_per_pair: float = 0.0  # sparse attention's indexer, every (query, key) pair
    mfu: float = MFU


@dataclass(frozen=True)
class Link:
    name: str
    bytes_per_s: float
    overhead_s: float
    gpus: int = 1  # GPUs sharing it: a worker of g GPUs gets g / gpus of the bandwidth


_QWEN3_32B_PARAMS = 32.8e9
_GLM5_PARAMS, _GLM5_ACTIVE = 744e9, 40e9
PRESETS: dict[str, Preset] = {
    "qwen3-32b": Preset(
        "qwen3-32b",
        bytes_per_token=64 * 8 * 128 * 2 * 2,
        active_params=_QWEN3_32B_PARAMS,
        weight_bytes=2 * _QWEN3_32B_PARAMS,
        active_weight_bytes=2 * _QWEN3_32B_PARAMS,
        attn_flops_per_pair=64 * 64 * 128 * 2 * 2,
        gpus=1,
    ),
    "glm5-fp8": Preset(
        "glm5-fp8",
        bytes_per_token=78 * 656,
        active_params=_GLM5_ACTIVE,
        weight_bytes=_GLM5_PARAMS,
        active_weight_bytes=_GLM5_ACTIVE,
        attn_flops_per_pair=78 * 64 * 2 * (576 + 512),
        gpus=8,
        gemm_flops_per_s=H200_FP8,
        attn_window=2048,
        index_flops_per_pair=78 * 32 * 128 * 2,
    ),
}
LINKS: dict[str, Link] = {
    "efa-3200": Link("efa-3200", 3200e9 / 8, TRANSFER_OVERHEAD_S, gpus=8),
    "tcp-100": Link("tcp-100", 100e9 / 8, 0.005),
}


def causal_pairs(new: int, ctx: int, window: int | None = None) -> int:
    """(query, key) pairs when the last ``new`` of ``ctx`` tokens attend causally (each to itself
    and the tokens before it), at most ``window`` keys per query."""
    first, last = ctx - new + 1, ctx  # keys seen by the first and the last new token
    if new <= 0:
        return 0
    if window is None or last <= window:
        return (first + last) * new // 2
    if first > window:
        return window * new
    return (first + window) * (window - first + 1) // 2 + (last - window) * window


class CostModel:
    """Durations for one worker under ``preset`` and ``link``; all 0 when disabled."""

    def __init__(
        self,
        preset: str | Preset = "qwen3-32b",
        link: str | Link = "efa-3200",
        *,
        enabled: bool = True,
        time_scale: float = 1.0,
    ) -> None:
        if isinstance(preset, str):
            if preset not in PRESETS:
                raise ValueError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
            preset = PRESETS[preset]
        if isinstance(link, str):
            if link not in LINKS:
                raise ValueError(f"unknown link {link!r}; choose from {', '.join(LINKS)}")
            link = LINKS[link]
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        self.preset = preset
        self.link = link
        self.enabled = enabled
        self.time_scale = float(time_scale)

    @property
    def bytes_per_token(self) -> int:
        return self.preset.bytes_per_token

    def prefill_s(self, new: int, ctx: int) -> float:
        if not self.enabled or new <= 0:
            return 0.0
        p = self.preset
        gemm = new * 2 * p.active_params / (p.gpus * p.gemm_flops_per_s * p.mfu)
        flops = causal_pairs(new, ctx, p.attn_window) * p.attn_flops_per_pair
        flops += causal_pairs(new, ctx) * p.index_flops_per_pair
        attn = flops / (p.gpus * p.attn_flops_per_s * p.mfu)
        return max(p.weight_bytes / (p.gpus * p.hbm_bytes_per_s), gemm + attn)

    def decode_step_s(self, total_ctx: int) -> float:
        """One decode step with ``total_ctx`` tokens of KV across the running batch."""
        if not self.enabled:
            return 0.0
        p = self.preset
        return (p.active_weight_bytes + total_ctx * p.bytes_per_token) / (p.gpus * p.hbm_bytes_per_s)

    def transfer_s(self, nbytes: int) -> float:
        if not self.enabled:
            return 0.0
        link = self.link
        share = link.bytes_per_s * min(self.preset.gpus, link.gpus) / link.gpus
        return link.overhead_s + nbytes / share

    def wall(self, sim_s: float) -> float:
        """Wall seconds to sleep for ``sim_s`` simulated seconds."""
        return sim_s / self.time_scale
