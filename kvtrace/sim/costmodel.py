"""How long simulated work takes.  All results are in *simulated* seconds.

The engine (:mod:`kvtrace.sim.engine`) asks this module for durations and sleeps
``simulated / time_scale`` wall seconds, so a ``time_scale`` of 10 replays a 10-minute session in
one minute; with ``enabled=False`` (``--no-cost``) every duration is 0 and the engine never
sleeps.  Span durations are wall time: multiply by the ``kvtrace.sim.time_scale`` resource
attribute to read them in simulated time (TTLs and lease durations are configured in simulated
seconds and compressed the same way).

The presets (:mod:`kvtrace.sim.presets`: the published p5en / TP 8 setup, every number's public
source) feed these formulas, per worker of ``tp`` GPUs (tensor parallel):

- prefill of ``new`` tokens of a ``ctx``-token prompt, in ``chunks = ceil(new / chunk_tokens)``
  forward passes (vLLM's chunked prefill)::

      t = max(chunks * weight_bytes / (tp * hbm),                      # every chunk reads all weights
              new * 2 * (active_params - routed) / (tp * gemm_peak * gemm_eff)   # dense GEMMs
              + routed_gemm_s(new)                                     # routed experts (MoE)
              + pairs * attn_flops_per_pair * attn_pad / (tp * attn_peak * attn_eff)   # attention
              + all_pairs * index_flops_per_pair / (tp' * attn_peak * index_eff))      # DSA indexer
          + layers * allreduces_per_layer
            * (chunks * allreduce_latency + 2 (tp-1)/tp * new * hidden * act_bytes / nvlink)   # TP
          + moe_layers * new * experts_per_token * hidden * act_bytes * combine_passes / hbm  # MoE

  ``pairs`` = (query, key) pairs of causal attention over the new tokens (each new token sees the
  tokens before it, at most ``attn_window`` of them: DSA's top-k), ``all_pairs`` the same without
  the window (the indexer scores every key).  The all-reduce is NCCL's ring formula with the bus
  bandwidth nccl-tests measures, on the critical path (vLLM does not overlap it); the MoE term is
  the expert outputs' write and read back for the weighted combine (every TP rank handles every
  token's full hidden state), only the read back when the routed GEMMs come from a measured curve
  (its down GEMM writes them).  Presets with a ``moe_curve`` time their routed experts' GEMMs by it
  (:mod:`kvtrace.sim.moe_cost`: achieved throughput against rows per expert, per chunk and MoE
  layer, floored by the weights' read); ``routed`` = their parameters per token, 0 without a
  curve (every GEMM at ``gemm_eff``).  ``attn_pad`` is the heads the attention kernel computes
  per rank over the real ones (vLLM pads GLM-5's 8 per rank to 64), except that a prompt of at
  most ``attn_window`` tokens runs as dense MHA at ``mha_flops_per_pair`` / ``mha_eff`` when the
  preset has them (vLLM's sparse MLA does); ``tp'`` = tp when the indexer is split over the
  ranks, 1 when it is replicated;
- decode step (continuous batching; every running decode on the worker shares one step), memory
  bound, plus one small all-reduce per call: ``t = (active_weight_bytes + sum(ctx_i) *
  bytes_per_token) / (tp * hbm) + layers * allreduces_per_layer * allreduce_latency``;
- transfer of ``blocks`` blocks (``nbytes``) over NIXL: every GPU moves its own share of the KV
  (``nbytes / tp`` when KV heads are split over the ranks, all of it for MLA) as ``blocks x layers
  x kv_regions_per_layer`` descriptors spread over its rails, in parallel with the other GPUs::

      t = overhead + max(descriptors * descriptor_s / rails, gpu_bytes / gpu_link_share)

  (posting is pipelined with the wire: whichever bound is larger); ``gpu_link_share`` is the link's
  per-GPU bandwidth (EFA: two 200 Gb/s devices per GPU) or a shared NIC's bandwidth / tp.

Queueing: prefills on one worker run one at a time (FIFO), decodes share steps.
"""

from __future__ import annotations

import math

from kvtrace.sim.moe_cost import routed_active_params, routed_gemm_s
from kvtrace.sim.presets import LINKS, PRESETS, Link, Preset

__all__ = ["LINKS", "PRESETS", "CostModel", "Link", "Preset", "causal_pairs", "ring_allreduce_s"]


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


def ring_allreduce_s(nbytes: float, n: int, bus_bytes_per_s: float, latency_s: float) -> float:
    """One ring all-reduce of ``nbytes`` over ``n`` GPUs: latency + 2(n-1)/n x bytes / bus bandwidth
    (0 on one GPU)."""
    if n <= 1:
        return 0.0
    return latency_s + 2 * (n - 1) / n * nbytes / bus_bytes_per_s


class CostModel:
    """Durations for one worker under ``preset`` and ``link``; all 0 when disabled (``block_size``
    None: the preset's)."""

    def __init__(
        self,
        preset: str | Preset = "qwen3-32b",
        link: str | Link = "efa-3200",
        *,
        enabled: bool = True,
        time_scale: float = 1.0,
        block_size: int | None = None,
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
        block_size = preset.block_size if block_size is None else block_size
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        self.preset = preset
        self.link = link
        self.enabled = enabled
        self.time_scale = float(time_scale)
        self.block_size = block_size

    @property
    def bytes_per_token(self) -> int:
        return self.preset.bytes_per_token

    # ------------------------------------------------------------------ prefill
    def prefill_s(self, new: int, ctx: int) -> float:
        if not self.enabled or new <= 0:
            return 0.0
        p = self.preset
        chunks = math.ceil(new / p.chunk_tokens)
        weights = chunks * p.weight_bytes / (p.gpus * p.hbm_bytes_per_s)
        return max(weights, self.compute_s(new, ctx)) + self.tp_allreduce_s(new) + self.moe_dispatch_s(new)

    def compute_s(self, new: int, ctx: int) -> float:
        """GEMMs (routed experts by their curve) and attention (with DSA's indexer) at the kernels'
        efficiency."""
        return self.gemm_s(new) + self.attention_s(new, ctx)

    def gemm_s(self, new: int) -> float:
        """Dense GEMMs at ``gemm_eff`` plus, for a preset with a ``moe_curve``, its routed experts'."""
        p = self.preset
        dense = new * 2 * (p.active_params - routed_active_params(p))
        return dense / (p.gpus * p.gemm_flops_per_s * p.gemm_eff) + routed_gemm_s(p, new)

    def attention_s(self, new: int, ctx: int) -> float:
        """Causal (windowed) attention with the kernel's head padding, and DSA's indexer over every pair."""
        p = self.preset
        pairs = causal_pairs(new, ctx, p.attn_window)
        if p.mha_flops_per_pair and p.attn_window is not None and ctx <= p.attn_window:
            attn = pairs * p.mha_flops_per_pair / (p.gpus * p.attn_flops_per_s * p.mha_eff)
        else:
            attn = pairs * p.attn_flops_per_pair * p.attn_pad / (p.gpus * p.attn_flops_per_s * p.attn_eff)
        if not p.index_flops_per_pair:
            return attn
        index_ranks = p.gpus if p.index_sharded else 1
        index = causal_pairs(new, ctx) * p.index_flops_per_pair
        return attn + index / (index_ranks * p.attn_flops_per_s * p.index_eff)

    def tp_allreduce_s(self, new: int) -> float:
        """The tensor-parallel all-reduces of a prefill: per layer, per chunk (latency) and over
        every new token's activations (bandwidth)."""
        p = self.preset
        if p.gpus <= 1 or new <= 0:
            return 0.0
        calls = p.layers * p.allreduces_per_layer
        chunks = math.ceil(new / p.chunk_tokens)
        per_call = ring_allreduce_s(new * p.hidden * p.act_bytes, p.gpus, p.nvlink_bytes_per_s, 0.0)
        return calls * (chunks * p.allreduce_latency_s + per_call)

    def moe_dispatch_s(self, new: int) -> float:
        """MoE dispatch/combine memory traffic: each token's top-k expert outputs written and read back."""
        p = self.preset
        traffic = p.moe_layers * new * p.experts_per_token * p.hidden * p.act_bytes * p.moe_combine_passes
        return traffic / p.hbm_bytes_per_s

    # ------------------------------------------------------------------ decode
    def decode_step_s(self, total_ctx: int) -> float:
        """One decode step with ``total_ctx`` tokens of KV across the running batch."""
        if not self.enabled:
            return 0.0
        weights, per_token, bandwidth, comm = self._decode_terms()
        return (weights + total_ctx * per_token) / bandwidth + comm

    def decode_steps_wall(self, total_ctx: int, n: int) -> list[float]:
        """``wall(decode_step_s(c))`` for ``c`` from ``total_ctx`` to ``total_ctx + n - 1``, the same
        numbers, in one pass: a decode alone on its engine, step by step (:mod:`kvtrace.sim.decoding`)."""
        if not self.enabled:
            return [0.0] * n
        weights, per_token, bandwidth, comm = self._decode_terms()
        scale = self.time_scale
        return [((weights + c * per_token) / bandwidth + comm) / scale for c in range(total_ctx, total_ctx + n)]

    def _decode_terms(self) -> tuple[float, int, float, float]:
        """A decode step's weights read, KV bytes per token of context, the bandwidth both are read
        at (tp x hbm), and its all-reduces' latency."""
        p = self.preset
        comm = p.layers * p.allreduces_per_layer * p.allreduce_latency_s if p.gpus > 1 else 0.0
        return p.active_weight_bytes, p.bytes_per_token, p.gpus * p.hbm_bytes_per_s, comm

    # ------------------------------------------------------------------ transfer
    def descriptors(self, blocks: int) -> int:
        """NIXL descriptors each GPU reads for ``blocks`` blocks (one per block per layer region)."""
        return blocks * self.preset.layers * self.preset.kv_regions_per_layer

    def transfer_s(self, nbytes: int, blocks: int | None = None) -> float:
        """One KV load of ``nbytes`` (``blocks`` blocks; None: ``nbytes`` / the block's bytes)."""
        if not self.enabled:
            return 0.0
        p, link = self.preset, self.link
        if blocks is None:
            blocks = math.ceil(nbytes / (p.bytes_per_token * self.block_size))
        gpu_bytes = nbytes / p.gpus if p.kv_sharded else nbytes
        share = link.bytes_per_s if link.per_gpu else link.bytes_per_s / p.gpus
        posting = self.descriptors(blocks) * link.descriptor_s / link.rails
        return link.overhead_s + max(posting, gpu_bytes / share)

    def wall(self, sim_s: float) -> float:
        """Wall seconds to sleep for ``sim_s`` simulated seconds."""
        return sim_s / self.time_scale
