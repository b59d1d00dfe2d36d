"""The routed experts' GEMMs of a MoE prefill, from a measured curve of the kernel's throughput.

At tensor parallel ``tp`` every rank holds a ``1/tp`` slice of every routed expert, and a chunk of
``T`` tokens routed top-``k`` of ``E`` experts gives each expert ``T k / E`` rows: a few dozen at 1k
tokens, far below what a grouped GEMM needs to reach its dense efficiency.  So the time of one MoE
layer on one rank is read off the preset's ``moe_curve`` (rows per expert -> achieved FLOP/s per
GPU, measured on the kernel vLLM runs), interpolated piecewise-linearly between its points,
proportional to the rows below the first point (the kernel's time stays that of the first point)
and constant past the last one; never below reading the touched experts' weight slices once at
HBM bandwidth::

    layer_s(T) = max(T k 2 expert_params / tp / throughput(T k / E),
                     touched(T) expert_bytes / tp / hbm)
    touched(T) = E (1 - (1 - k/E)^T)          # experts hit by T tokens routed uniformly

A prefill of ``new`` tokens runs ``ceil(new / chunk_tokens)`` chunks (full ones and the remainder),
each through every MoE layer.
"""

from __future__ import annotations

import bisect

from kvtrace.sim.presets import Preset


def throughput_at(curve: tuple[tuple[float, float], ...], rows: float) -> float:
    """Achieved FLOP/s at ``rows`` rows per expert: piecewise-linear over the curve's points (rows
    ascending), proportional to ``rows`` below the first, the last point's past the last."""
    xs = [x for x, _ in curve]
    if rows <= xs[0]:
        return curve[0][1] * rows / xs[0]
    if rows >= xs[-1]:
        return curve[-1][1]
    i = bisect.bisect_right(xs, rows)
    (x0, y0), (x1, y1) = curve[i - 1], curve[i]
    return y0 + (y1 - y0) * (rows - x0) / (x1 - x0)


def experts_touched(tokens: int, experts: int, top_k: int) -> float:
    """Expected distinct experts a chunk of ``tokens`` tokens routes to (top-``top_k`` of ``experts``,
    uniform)."""
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def routed_layer_s(p: Preset, tokens: int) -> float:
    """One MoE layer's routed-expert GEMMs on one rank for a chunk of ``tokens`` tokens."""
    if tokens <= 0:
        return 0.0
    rows = tokens * p.experts_per_token / p.routed_experts
    flops = tokens * p.experts_per_token * 2 * p.expert_params / p.gpus
    weights = experts_touched(tokens, p.routed_experts, p.experts_per_token) * p.expert_bytes / p.gpus
    return max(flops / throughput_at(p.moe_curve, rows), weights / p.hbm_bytes_per_s)


def routed_gemm_s(p: Preset, new: int) -> float:
    """The routed experts' GEMMs of a prefill of ``new`` tokens: every chunk through every MoE layer."""
    if new <= 0 or not p.moe_curve:
        return 0.0
    full, rest = divmod(new, p.chunk_tokens)
    return p.moe_layers * (full * routed_layer_s(p, p.chunk_tokens) + routed_layer_s(p, rest))


def routed_active_params(p: Preset) -> float:
    """Routed-expert parameters one token uses (0 when the preset has no measured curve: its GEMMs
    are all at the dense efficiency)."""
    return p.moe_layers * p.experts_per_token * p.expert_params if p.moe_curve else 0.0


__all__ = ["experts_touched", "routed_active_params", "routed_gemm_s", "routed_layer_s", "throughput_at"]
