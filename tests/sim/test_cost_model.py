"""The simulator's cost model, with exact numbers: each term of its formulas on hand-computed
cases (the published p5en / TP 8 presets), and the causal attention pairs with and without a
sliding window."""

from __future__ import annotations

import pytest

from kvtrace.sim.costmodel import CostModel, causal_pairs, ring_allreduce_s
from kvtrace.sim.moe_cost import experts_touched, routed_layer_s
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


# GLM-5-FP8 (config.json): 75 MoE layers, 256 routed experts, top-8, one expert 3 x 6,144 x 2,048 params
MOE_LAYERS, EXPERTS, TOP_K, EXPERT = 75, 256, 8, 3 * 6144 * 2048
ROUTED = MOE_LAYERS * TOP_K * EXPERT  # routed-expert parameters per token; the rest of the 40 B is dense
# vLLM's fused_moe_kernel on an H200, one layer per rank at TP 8: tokens -> ms (docs/benchmarks.md, "H200")
MEASURED_MS = {160: 0.368, 512: 0.479, 1024: 0.541, 2048: 0.693, 4096: 1.056, 8192: 1.778}
MLA_PAIR, MHA_PAIR, INDEX_PAIR = 78 * 64 * 2 * 1088, 78 * 64 * 2 * 512, 78 * 32 * 128 * 2
SPARSE_DECODE_EFF = 410 / 989.5  # FlashMLA's FP8 sparse decode kernel (410 TFLOPS on H800)


def glm5_expected_s(new: int) -> float:
    """A whole-prompt GLM-5 prefill of ``new`` tokens (no cache) from the formulas, the routed experts
    at the measured per-layer times (``new`` a sum of measured chunk sizes)."""
    full, rest = divmod(new, 8192)
    routed = MOE_LAYERS * (full * MEASURED_MS[8192] + (MEASURED_MS[rest] if rest else 0.0)) / 1e3
    dense = new * 2 * (40e9 - ROUTED) / (8 * FP8 * 0.62)
    window = min(new, 2048)
    sparse = window * (window + 1) // 2 + (new - window) * 2048
    if new <= 2048:  # vLLM: dense MHA, each rank its own 8 heads
        attn = sparse * MHA_PAIR / (8 * BF16 * 0.65)
    else:  # the FP8 sparse decode kernel, 8 heads per rank padded to 64
        attn = sparse * MLA_PAIR * 64 / 8 / (8 * BF16 * SPARSE_DECODE_EFF)
    index = new * (new + 1) // 2 * INDEX_PAIR / (BF16 * 0.65)  # replicated: every rank scores every pair
    chunks = -(-new // 8192)
    allreduce = 78 * 2 * (chunks * AR_LAT + 2 * 7 / 8 * new * 6144 * 2 / BUSBW)
    combine = MOE_LAYERS * new * TOP_K * 6144 * 2 / HBM  # read back; the down GEMM's write is measured
    return max(chunks * 744e9 / (8 * HBM), routed + dense + attn + index) + allreduce + combine


def test_glm5_moe_layer_follows_the_measured_curve_at_the_measured_points():
    glm = CostModel("glm5-fp8").preset
    for tokens, ms in MEASURED_MS.items():
        assert routed_layer_s(glm, tokens) == pytest.approx(ms / 1e3, rel=0.02), tokens
    # between points: throughput interpolated over rows per expert (300 tokens: 9.375 rows, 5 -> 16)
    rows = [(t * TOP_K / EXPERTS, t * TOP_K * 2 * EXPERT / 8 / (ms / 1e3)) for t, ms in MEASURED_MS.items()]
    (x0, y0), (x1, y1) = rows[0], rows[1]
    rate = y0 + (y1 - y0) * (300 * TOP_K / EXPERTS - x0) / (x1 - x0)
    assert routed_layer_s(glm, 300) == pytest.approx(300 * TOP_K * 2 * EXPERT / 8 / rate)


def test_glm5_moe_grows_sublinearly_at_small_chunks_and_reaches_the_measured_throughput_at_8k():
    glm = CostModel("glm5-fp8").preset
    times = [routed_layer_s(glm, t) for t in (160, 320, 640, 1280, 2560)]
    # twice the tokens, less than twice the time
    assert all(0 < b / a < 2 for a, b in zip(times, times[1:], strict=False))
    assert times[-1] / times[0] < 3  # 16x the tokens
    flops_8k = 8192 * TOP_K * 2 * EXPERT / 8
    assert flops_8k / routed_layer_s(glm, 8192) / FP8 == pytest.approx(0.176, abs=0.001)  # of FP8 peak
    assert routed_layer_s(glm, 16384) == pytest.approx(2 * routed_layer_s(glm, 8192))  # past the curve: linear


def test_glm5_moe_is_never_faster_than_reading_the_touched_experts_weights():
    glm = CostModel("glm5-fp8").preset
    for tokens in (1, 4, 8, 64, 160, 8192):
        touched = EXPERTS * (1 - (1 - TOP_K / EXPERTS) ** tokens)
        assert routed_layer_s(glm, tokens) >= touched * EXPERT / 8 / HBM * (1 - 1e-12)
    # one token: the curve's first point scaled by its rows would be 0.168 ms; 8 experts' slices take 7.9 us
    assert routed_layer_s(glm, 1) == pytest.approx(0.168e-3)
    assert experts_touched(1, EXPERTS, TOP_K) == pytest.approx(8.0)


def test_glm5_prefill_is_dense_gemms_routed_experts_attention_indexer_allreduce_and_combine():
    glm = CostModel("glm5-fp8")
    for new in (2048, 8192, 8192 + 2048, 24576):
        assert glm.prefill_s(new, new) == pytest.approx(glm5_expected_s(new)), new
    assert glm.moe_dispatch_s(8192) == pytest.approx(MOE_LAYERS * 8192 * TOP_K * 6144 * 2 / HBM)
    # 2,048 tokens: dense MHA; 2,049: the padded sparse kernel over 2,048 keys each
    assert glm.attention_s(2048, 2048) < glm.attention_s(2049, 2049) / 10
    assert glm.prefill_s(10, 10) == pytest.approx(  # 744 GB of FP8 experts over 8 GPUs' HBM
        744e9 / (8 * HBM) + 78 * 2 * (AR_LAT + 2 * 7 / 8 * 10 * 6144 * 2 / BUSBW) + 75 * 10 * 8 * 6144 * 2 / HBM
    )


def test_glm5_prefill_with_a_cached_prefix_runs_the_sparse_path_for_its_new_tokens():
    glm = CostModel("glm5-fp8")
    pairs = 1024 * 2048  # 1,024 new tokens after 4,096 cached: each sees 2,048 keys
    attn = pairs * MLA_PAIR * 8 / (8 * BF16 * SPARSE_DECODE_EFF)
    index = (4097 + 5120) * 1024 // 2 * INDEX_PAIR / (BF16 * 0.65)
    assert glm.attention_s(1024, 5120) == pytest.approx(attn + index)
    assert glm.gemm_s(1024) == pytest.approx(1024 * 2 * (40e9 - ROUTED) / (8 * FP8 * 0.62) + 75 * 0.541e-3)


def test_presets_without_a_curve_keep_one_gemm_efficiency_for_every_gemm():
    """Qwen3 and Llama: no routed experts, no head padding, no indexer: the formula as before."""
    for name, params, layers, heads_dim in [
        ("qwen3-32b", 32.8e9, 64, 64 * 128),
        ("llama-3.3-70b", 70.6e9, 80, 64 * 128),
    ]:
        model = CostModel(name)
        assert model.preset.moe_curve == () and routed_layer_s(model.preset, 0) == 0.0
        for new in (2048, 8192, 24576):
            gemm = new * 2 * params / (8 * BF16 * 0.7)
            attn = new * (new + 1) // 2 * layers * heads_dim * 4 / (8 * BF16 * 0.65)
            assert model.gemm_s(new) == pytest.approx(gemm)
            assert model.compute_s(new, new) == pytest.approx(gemm + attn)
            assert model.prefill_s(new, new) == pytest.approx(gemm + attn + model.tp_allreduce_s(new))


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


@pytest.mark.parametrize("name", sorted(PRESETS))
@pytest.mark.parametrize("scale", [1.0, 7.5])
def test_decode_steps_in_one_pass_are_the_step_by_step_numbers(name, scale):
    """A decode computed ahead (kvtrace.sim.decoding) takes its steps from ``decode_steps_wall``:
    bit for bit ``wall(decode_step_s(c))``, or its tokens' times would drift from the served path's."""
    model = CostModel(name, time_scale=scale)
    for ctx in (0, 1, 13_317, 250_000):
        assert model.decode_steps_wall(ctx, 50) == [model.wall(model.decode_step_s(c)) for c in range(ctx, ctx + 50)]
    assert CostModel(name, enabled=False).decode_steps_wall(100, 3) == [0.0, 0.0, 0.0]
