"""The simulator's cost model, with exact numbers: its formulas, and the causal attention pairs
with and without a sliding window."""

from __future__ import annotations

import math

import pytest

from kvtrace.sim.costmodel import CostModel


def test_cost_model_formulas():
    """The presets' numbers are the documented public figures (H200, Qwen3-32B, GLM-5) and MFU 0.5."""
    qwen = CostModel("qwen3-32b", "efa-3200", time_scale=10.0)
    assert qwen.bytes_per_token == 64 * 8 * 128 * 2 * 2
    weights = 2 * 32.8e9 / 4.8e12  # one read of the BF16 weights from one H200's HBM
    gemm = 1000 * 2 * 32.8e9 / (989.5e12 * 0.5)
    pairs = 3000 * 1000 + 1000 * 1001 // 2  # 1000 new tokens after 3000 cached, causal
    assert qwen.prefill_s(1000, 4000) == pytest.approx(gemm + pairs * 64 * 64 * 128 * 4 / (989.5e12 * 0.5))
    assert qwen.prefill_s(10, 4000) == pytest.approx(weights)  # a short prefill is bound by reading the weights
    assert qwen.decode_step_s(8192) == pytest.approx(weights + 8192 * 262_144 / 4.8e12)
    nbytes = 20 * 16 * 262_144
    assert qwen.transfer_s(nbytes) == pytest.approx(0.001 + nbytes / (400e9 / 8))  # one GPU's share of the EFA
    assert qwen.wall(1.0) == pytest.approx(0.1)
    glm = CostModel("glm5-fp8")
    assert glm.bytes_per_token == 78 * 656
    assert glm.transfer_s(51_168) == pytest.approx(0.001 + 51_168 / 400e9)  # 8 GPUs: the whole EFA
    assert CostModel("glm5-fp8", "tcp-100").transfer_s(51_168) == pytest.approx(0.005 + 51_168 / 12.5e9)
    sparse = (2048 * (2048 + 1) // 2) + (8000 - 2048) * 2048  # each query sees at most 2048 keys
    attn = sparse * 78 * 64 * 2 * 1088 + 8000 * 8001 // 2 * 78 * 32 * 128 * 2
    assert glm.prefill_s(8000, 8000) == pytest.approx(8000 * 80e9 / (8 * 1979e12 * 0.5) + attn / (8 * 989.5e12 * 0.5))
    assert glm.decode_step_s(0) == pytest.approx(40e9 / (8 * 4.8e12))
    off = CostModel(enabled=False)
    assert (off.prefill_s(10, 10), off.decode_step_s(10), off.transfer_s(10)) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="unknown preset"):
        CostModel("llama")
    with pytest.raises(ValueError, match="unknown link"):
        CostModel(link="carrier-pigeon")
    assert math.isclose(qwen.decode_step_s(0) * 2, qwen.decode_step_s(0) + weights)


def test_causal_pairs_with_and_without_a_window():
    from kvtrace.sim.costmodel import causal_pairs

    brute = lambda new, ctx, w=None: sum(min(k, w or k) for k in range(ctx - new + 1, ctx + 1))  # noqa: E731
    for new, ctx, w in [(1, 1, None), (3, 3, None), (5, 12, None), (10, 10, 4), (4, 20, 8), (12, 16, 8), (0, 5, None)]:
        assert causal_pairs(new, ctx, w) == brute(new, ctx, w)
