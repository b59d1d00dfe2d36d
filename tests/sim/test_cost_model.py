"""The simulator's cost model, with exact numbers: each term of its formulas on hand-computed
cases (the published p5en / TP 8 presets), and the causal attention pairs with and without a
sliding window."""

from __future__ import annotations

import pytest

from kvtrace.sim.costmodel import CostModel, causal_pairs, ring_allreduce_s
from kvtrace.sim.presets import PRESETS

HBM, BF16, FP8 = 4.8e12, 989.5e12, 1979e12  # H200 datasheet
BUSBW, AR_LAT = 470e9, 10e-6  # nccl-tests all-reduce bus bandwidth, per-call latency
EFA_GPU, DESC, REQ = 50e9, 1.78e-6, 60e-6  # 2 x 200 Gb/s per GPU, per descriptor per rail, per load


def test_every_preset_is_the_published_p5en_configuration():
    """TP 8 on one p5en per role, max-num-seqs 8, each preset's KV bytes per token from its config."""
    assert set(PRESETS) == {"qwen3-32b", "glm5-fp8", "llama-3.3-70b"}
    assert {(p.tp, p.max_num_seqs) for p in PRESETS.values()} == {(8, 8)}
    assert PRESETS["qwen3-32b"].bytes_per_token == 64 * 8 * 128 * 2 * 2 == 262_144
    assert PRESETS["glm5-fp8"].bytes_per_token == 78 * (656 + 132) == 61_464
    assert PRESETS["llama-3.3-70b"].bytes_per_token == 80 * 8 * 128 * 2 * 2 == 327_680
    # KV blocks: vLLM's 16 tokens, but 64 for GLM-5 (its sparse MLA backend takes no other)
    assert {n: p.block_size for n, p in PRESETS.items()} == {"qwen3-32b": 16, "glm5-fp8": 64, "llama-3.3-70b": 16}


def test_ring_allreduce_is_latency_plus_two_n_minus_one_over_n_bytes_over_bus_bandwidth():
    assert ring_allreduce_s(8e6, 8, 400e9, 1e-5) == pytest.approx(1e-5 + 2 * 7 / 8 * 8e6 / 400e9)
    assert ring_allreduce_s(8e6, 2, 400e9, 0.0) == pytest.approx(8e6 / 400e9)
    assert ring_allreduce_s(8e6, 1, 400e9, 1e-5) == 0.0  # one GPU: nothing to reduce


def test_dense_prefill_is_compute_plus_per_layer_allreduces_at_tp8():
    """Qwen3-32B, 1,000 new tokens after 3,000 cached: one chunk; compute beats one weight read."""
    qwen = CostModel("qwen3-32b")
    gemm = 1000 * 2 * 32.8e9 / (8 * BF16 * 0.7)
    pairs = 3000 * 1000 + 1000 * 1001 // 2
    attn = pairs * 64 * 64 * 128 * 4 / (8 * BF16 * 0.65)
    assert qwen.compute_s(1000, 4000) == pytest.approx(gemm + attn)
    allreduce = 64 * 2 * (AR_LAT + 2 * 7 / 8 * 1000 * 5120 * 2 / BUSBW)
    assert qwen.tp_allreduce_s(1000) == pytest.approx(allreduce)
    assert qwen.moe_dispatch_s(1000) == 0.0  # dense
    assert qwen.prefill_s(1000, 4000) == pytest.approx(gemm + attn + allreduce)


def test_a_short_prefill_is_bound_by_reading_the_weights_once_per_chunk():
    qwen = CostModel("qwen3-32b")
    weights = 2 * 32.8e9 / (8 * HBM)
    assert qwen.prefill_s(10, 4000) == pytest.approx(weights + 64 * 2 * (AR_LAT + 2 * 7 / 8 * 10 * 5120 * 2 / BUSBW))
    # 8,193 new tokens are two chunks (max_num_batched_tokens 8,192): two latencies per all-reduce
    assert qwen.tp_allreduce_s(8193) == pytest.approx(64 * 2 * (2 * AR_LAT + 2 * 7 / 8 * 8193 * 5120 * 2 / BUSBW))


def test_glm5_prefill_adds_sparse_attention_its_indexer_and_moe_dispatch():
    glm = CostModel("glm5-fp8")
    new = 8000  # one chunk, no cache
    sparse = 2048 * 2049 // 2 + (8000 - 2048) * 2048  # each query sees at most 2,048 keys
    gemm = new * 2 * 40e9 / (8 * FP8 * 0.62)
    attn = (sparse * 78 * 64 * 2 * 1088 + 8000 * 8001 // 2 * 78 * 32 * 128 * 2) / (8 * BF16 * 0.65)
    assert glm.compute_s(new, new) == pytest.approx(gemm + attn)
    moe = 75 * new * 8 * 6144 * 2 * 2 / HBM  # top-8 expert outputs written and read back, 75 MoE layers
    assert glm.moe_dispatch_s(new) == pytest.approx(moe)
    allreduce = 78 * 2 * (AR_LAT + 2 * 7 / 8 * new * 6144 * 2 / BUSBW)
    assert glm.prefill_s(new, new) == pytest.approx(gemm + attn + allreduce + moe)
    assert glm.prefill_s(10, 10) == pytest.approx(  # 744 GB of FP8 experts over 8 GPUs' HBM
        744e9 / (8 * HBM) + 78 * 2 * (AR_LAT + 2 * 7 / 8 * 10 * 6144 * 2 / BUSBW) + 75 * 10 * 8 * 6144 * 4 / HBM
    )


def test_decode_step_reads_active_weights_and_the_batch_kv_plus_small_allreduces():
    qwen, glm = CostModel("qwen3-32b"), CostModel("glm5-fp8")
    assert qwen.decode_step_s(8192) == pytest.approx((2 * 32.8e9 + 8192 * 262_144) / (8 * HBM) + 64 * 2 * AR_LAT)
    assert glm.decode_step_s(0) == pytest.approx(40e9 / (8 * HBM) + 78 * 2 * AR_LAT)


def test_transfer_is_overhead_plus_the_larger_of_descriptor_posting_and_the_gpus_link_share():
    """Qwen: KV heads split over 8 ranks, K and V regions per layer; GLM-5: MLA replicated on every
    rank, latent + indexer regions; EFA: 2 rails of 200 Gb/s per GPU."""
    qwen = CostModel("qwen3-32b")
    blocks = 20
    nbytes = blocks * 16 * 262_144
    assert qwen.descriptors(blocks) == 20 * 64 * 2
    posting = 20 * 64 * 2 * DESC / 2
    assert posting > nbytes / 8 / EFA_GPU  # 4 KiB descriptors: message-rate bound
    assert qwen.transfer_s(nbytes) == pytest.approx(REQ + posting)
    assert qwen.transfer_s(nbytes, blocks=blocks) == qwen.transfer_s(nbytes)
    # a link without per-descriptor cost: the bytes bound, the NIC shared by the worker's 8 GPUs
    tcp = CostModel("qwen3-32b", "tcp-100")
    assert tcp.transfer_s(nbytes) == pytest.approx(0.005 + (nbytes / 8) / (12.5e9 / 8))
    glm = CostModel("glm5-fp8", "tcp-100")
    assert glm.transfer_s(61_464 * 16) == pytest.approx(0.005 + 61_464 * 16 / (12.5e9 / 8))  # every rank: all of it
    glm = CostModel("glm5-fp8")  # 64-token blocks: 64 x 61,464 B per GPU per block, 156 descriptors
    nbytes = 10 * 64 * 61_464
    assert glm.transfer_s(nbytes) == pytest.approx(REQ + max(10 * 78 * 2 * DESC / 2, nbytes / EFA_GPU))
    big = CostModel("glm5-fp8", block_size=1024)  # big blocks: few descriptors, the wire bound wins
    nbytes = 4 * 1024 * 61_464
    assert big.transfer_s(nbytes) == pytest.approx(REQ + nbytes / EFA_GPU)


def test_disabled_costs_are_zero_and_bad_names_are_refused():
    off = CostModel(enabled=False)
    assert (off.prefill_s(10, 10), off.decode_step_s(10), off.transfer_s(10)) == (0.0, 0.0, 0.0)
    assert CostModel(time_scale=10.0).wall(1.0) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="unknown preset"):
        CostModel("llama")
    with pytest.raises(ValueError, match="unknown link"):
        CostModel(link="carrier-pigeon")
    with pytest.raises(ValueError, match="block_size"):
        CostModel(block_size=0)


def test_causal_pairs_with_and_without_a_window():
    brute = lambda new, ctx, w=None: sum(min(k, w or k) for k in range(ctx - new + 1, ctx + 1))  # noqa: E731
    for new, ctx, w in [(1, 1, None), (3, 3, None), (5, 12, None), (10, 10, 4), (4, 20, 8), (12, 16, 8), (0, 5, None)]:
        assert causal_pairs(new, ctx, w) == brute(new, ctx, w)
