"""The calibration fit (kvtrace.analysis.calibrate) recovers the costs a hand-built store was made
with: prefill (fixed + per new token + per causal pair), transfer (fixed + per byte), decode step
(fixed + per context token of the batch), at the simulator's time scale; queued prefills are timed
from the previous one's end; a negative term is held at 0, and so is one the samples do not support
(the smallest AICc: tests/analysis/test_fitting.py); an outlier span is left out; too few samples is a
clear error."""

from __future__ import annotations

import numpy as np
import pytest

from kvtrace import semconv as sc
from kvtrace.analysis import calibrate as cal
from kvtrace.analysis import fitting
from kvtrace.testing.synth import SIM_D, SIM_P, SpanBuilder

SCALE = 5.0  # the simulator's kvtrace.sim.time_scale: spans last model time / SCALE
BS, BPT = 16, 1024
# model seconds
PRE = dict(fixed=0.02, per_token=1e-4, per_pair=2e-8)
XFER = dict(fixed=0.001, per_byte=2e-9)
DEC = dict(request=0.003, step=0.01, per_ctx=1e-6)


def pairs(new: int, ctx: int) -> float:
    return (2 * ctx - new + 1) * new / 2


def prefill_s(new, ctx):
    return PRE["fixed"] + PRE["per_token"] * new + PRE["per_pair"] * pairs(new, ctx)


def step_s(ctx):
    return DEC["step"] + DEC["per_ctx"] * ctx


def xfer_s(tokens):
    return XFER["fixed"] + XFER["per_byte"] * -(-tokens // BS) * BS * BPT


def resource(engine, role):
    return {sc.ENGINE_ID: engine, sc.ENGINE_ROLE: role, sc.SUBSTRATE: sc.SUBSTRATE_SIM, sc.SIM_TIME_SCALE: SCALE}


def engine_span(b, role, rid, start, end, prompt, cached, out=None, parent=None):
    name = sc.SPAN_ENGINE_PREFILL if role == sc.ROLE_PREFILL else sc.SPAN_ENGINE_DECODE
    engine = "sim-p0" if role == sc.ROLE_PREFILL else "sim-d0"
    attrs = {sc.GEN_AI_REQUEST_ID: rid, sc.KV_PROMPT_TOKENS: prompt, sc.REQUEST_CACHED_TOKENS: cached}
    if out is not None:
        attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] = out
    service = SIM_P if role == sc.ROLE_PREFILL else SIM_D
    return b.span(name, start, end, parent=parent, service=service, attrs=attrs, resource=resource(engine, role))


def transfer_span(b, role, rid, start, tokens, direction, parent):
    engine = "sim-p0" if role == sc.ROLE_PREFILL else "sim-d0"
    ms = xfer_s(tokens) * 1e3 / SCALE
    blocks = -(-tokens // BS)
    attrs = {
        sc.GEN_AI_REQUEST_ID: rid,
        sc.KV_DIRECTION: direction,
        sc.KV_TRANSFER_TOKENS: tokens,
        sc.KV_TRANSFER_BLOCKS: blocks,
        sc.KV_TRANSFER_BYTES: blocks * BS * BPT,
        sc.KV_TRANSFER_XFER_MS: ms,
        sc.KV_TRANSFER_STATUS: sc.TRANSFER_OK,
    }
    service = SIM_P if role == sc.ROLE_PREFILL else SIM_D
    res = resource(engine, role)
    b.span(sc.SPAN_KV_TRANSFER, start, start + ms, parent=parent, service=service, attrs=attrs, resource=res)
    return ms


# (prompt, cached on P, pulled by P from D, output tokens)
REQUESTS = [
    (500, 0, 0, 20),
    (900, 0, 0, 5),
    (1400, 496, 400, 12),
    (2000, 1392, 0, 30),
    (3000, 0, 0, 8),
    (3600, 2992, 600, 16),
    (4200, 0, 0, 40),
]


def build(directory, requests=REQUESTS, overlap_prefills: bool = False, slow_decode: int | None = None) -> None:
    """One request after the other (each on P, then on D); ``overlap_prefills``: every P span
    starts 1 ms after the one before (they queue); ``slow_decode``: that D span lasts 400 ms longer."""
    b = SpanBuilder()
    t, p_free, d_free = 0.0, 0.0, 0.0
    for i, (prompt, cached, pulled, out) in enumerate(requests):
        rid = f"r{i}"
        start = i * 1.0 if overlap_prefills else t
        # P: pull from D (if any), wait for the worker, prefill the rest, one decode step
        pull_ms = xfer_s(pulled) * 1e3 / SCALE if pulled else 0.0
        busy = max(start + pull_ms, p_free)
        p_end = busy + (prefill_s(prompt - cached - pulled, prompt) + step_s(prompt)) * 1e3 / SCALE
        p_free = p_end
        pspan = engine_span(b, sc.ROLE_PREFILL, rid, start, p_end, prompt, cached + pulled)
        if pulled:
            transfer_span(b, sc.ROLE_PREFILL, rid, start, pulled, sc.DIRECTION_D2P, pspan)
        # D: pull the prompt from P, then `out` steps (one request decoding at a time)
        d_start = max(p_end, d_free) + 1.0
        load = xfer_s(prompt) * 1e3 / SCALE
        steps = sum(step_s(prompt + k) for k in range(out))
        d_end = d_start + load + (DEC["request"] + steps) * 1e3 / SCALE + (400.0 if slow_decode == i else 0.0)
        dspan = engine_span(b, sc.ROLE_DECODE, rid, d_start, d_end, prompt, prompt, out=out)
        transfer_span(b, sc.ROLE_DECODE, rid, d_start, prompt, sc.DIRECTION_P2D, dspan)
        t, d_free = d_end + 10.0, d_end
    b.write(directory)


def fitted(directory):
    return cal.from_directory(directory)


def test_fit_recovers_the_costs_the_store_was_built_with(tmp_path):
    build(tmp_path)
    c = fitted(tmp_path)
    p, x, d = c.prefill.terms, c.transfer.terms, c.decode.terms
    assert p == pytest.approx({"fixed_s": 0.02, "per_new_token_s": 1e-4, "per_pair_s": 2e-8}, rel=1e-6, abs=1e-12)
    assert x == pytest.approx({"fixed_s": 0.001, "per_byte_s": 2e-9}, rel=1e-6, abs=1e-12)
    assert d == pytest.approx({"per_request_s": 0.003, "per_step_s": 0.01, "per_ctx_token_s": 1e-6}, rel=1e-5)
    assert (c.bytes_per_token, c.block_size, c.substrate, c.time_scale) == (BPT, BS, sc.SUBSTRATE_SIM, SCALE)
    assert (c.prefill.spans, c.prefill.samples, c.prefill.range) == ({sc.SPAN_ENGINE_PREFILL: 6}, 6, (8, 4200))
    d2p, p2d = (f"{sc.SPAN_KV_TRANSFER} {d}" for d in (sc.DIRECTION_D2P, sc.DIRECTION_P2D))
    assert c.transfer.spans == {d2p: 2, p2d: 7}
    assert c.decode.spans == {sc.SPAN_ENGINE_DECODE: 6}  # each worker's first span is its warm-up
    assert c.prefill.residual_ms < 1e-3 and c.decode.residual_ms < 1e-3 and c.transfer.residual_ms < 1e-6
    assert c.cost_numbers() == pytest.approx(
        {
            "prefill_fixed_s": 0.02,
            "prefill_per_token_s": 1e-4,
            "prefill_per_pair_s": 2e-8,
            "transfer_fixed_s": 0.001,
            "transfer_per_byte_s": 2e-9,
            "decode_fixed_s": 0.01,
            "decode_per_ctx_token_s": 1e-6,
            "bytes_per_token": BPT,
            "block_size": BS,
        },
        rel=1e-5,
        abs=1e-12,
    )


def test_queued_prefills_are_timed_from_the_previous_spans_end(tmp_path):
    build(tmp_path, overlap_prefills=True)
    c = fitted(tmp_path)
    assert c.prefill.terms == pytest.approx(
        {"fixed_s": 0.02, "per_new_token_s": 1e-4, "per_pair_s": 2e-8}, rel=1e-5, abs=1e-12
    )
    assert c.prefill.outliers == 0


def test_a_span_delayed_by_something_else_is_left_out_and_counted(tmp_path):
    build(tmp_path, slow_decode=3)
    c = fitted(tmp_path)
    assert (c.decode.samples, c.decode.outliers) == (5, 1)
    assert c.decode.terms == pytest.approx(
        {"per_request_s": 0.003, "per_step_s": 0.01, "per_ctx_token_s": 1e-6}, rel=1e-4
    )
    assert "5 samples (1 left out as outliers)" in "\n".join(c.lines())


def test_samples_proportional_over_a_narrow_range_are_priced_per_token_alone():
    # prompts of 12,000-13,000 tokens at 20 us per token, two of them 1 ms off: fixed + per pair
    # leaves the smaller residual (it bends to the two) but prices a 200-token prefill at 120 ms,
    # most of a 12,000-token one; the one-term fit, through the origin, wins
    new = np.array([12000.0, 12300, 12600, 12900, 13000, 12450])
    y = 2e-5 * new + 1e-3 * np.array([0, 0, 0, 0, 1, -1])
    x = np.column_stack([np.ones(6), new, cal.causal_pairs(new, new)])
    ss = {cols: float(np.linalg.lstsq(x[:, list(cols)], y, rcond=None)[1][0]) for cols in ((1,), (0, 2))}
    assert ss[(0, 2)] < 0.7 * ss[(1,)]
    coef, held = fitting.nonneg_lstsq(x, y, ("fixed_s", "per_new_token_s", "per_pair_s"))
    assert held == ("fixed_s", "per_pair_s")
    assert coef == pytest.approx([0.0, (new @ y) / (new @ new), 0.0], rel=1e-9, abs=1e-15)
    assert float(coef @ [1.0, 200, cal.causal_pairs(200, 12400)]) == pytest.approx(0.004, rel=1e-3)


# new tokens 2,200-3,800 after the warm-up (within a factor 2 of each other); no pulls, so P computes all
ALIKE = [(2000, 0, 0, 20), (2200, 0, 0, 5), (2600, 0, 0, 12), (3000, 0, 0, 30), (3400, 0, 0, 8), (3800, 0, 0, 16)]


def test_prefills_of_alike_prompts_hold_the_fixed_cost_at_zero(tmp_path, monkeypatch):
    # made without a fixed cost: per token and per pair are recovered, the fixed cost is not fitted
    monkeypatch.setitem(PRE, "fixed", 0.0)
    build(tmp_path, requests=ALIKE + [(2400, 0, 0, 40)])
    c = fitted(tmp_path)
    assert c.prefill.terms == pytest.approx(
        {"fixed_s": 0.0, "per_new_token_s": 1e-4, "per_pair_s": 2e-8}, rel=1e-6, abs=1e-12
    )
    assert (c.prefill.held_at_zero, c.prefill.range) == (("fixed_s",), (2200, 3800))
    assert c.notes[0] == (
        "the prefills computed 2,200-3,800 new tokens (within a factor 2): a fixed cost cannot be told from "
        "the per-token one there and is held at 0"
    )


def test_prefills_a_factor_2_apart_fit_the_fixed_cost(tmp_path):
    build(tmp_path, requests=ALIKE + [(4400, 0, 0, 40)])  # 2,200-4,400 new tokens
    c = fitted(tmp_path)
    assert c.prefill.terms == pytest.approx(
        {"fixed_s": 0.02, "per_new_token_s": 1e-4, "per_pair_s": 2e-8}, rel=1e-6, abs=1e-12
    )
    assert c.prefill.held_at_zero == ()


def test_too_few_samples_is_an_error_naming_the_spans(tmp_path):
    build(tmp_path, requests=REQUESTS[:4])
    with pytest.raises(cal.CalibrationError) as exc:
        fitted(tmp_path)
    assert str(exc.value) == (
        f"too few samples for the decode step fit: 3 (3 {sc.SPAN_ENGINE_DECODE}); it needs at least 4 "
        "(record more requests, or a run where this work happened)"
    )


def test_a_store_without_engine_spans_is_an_error(tmp_path):
    b = SpanBuilder()
    b.span(sc.SPAN_AGENT_SESSION, 0.0, 1.0)
    b.write(tmp_path)
    with pytest.raises(cal.CalibrationError, match="no kvtrace.engine.prefill / kvtrace.engine.decode spans"):
        fitted(tmp_path)


def test_the_printed_lines_carry_every_number_and_its_samples(tmp_path):
    build(tmp_path)
    lines = fitted(tmp_path).lines()
    assert lines[0] == f"calibrated from {tmp_path} (sim; model time = wall x 5)"
    parts = [line.split("; ")[:2] for line in lines[1:4]]  # the residual (rounding only) follows
    assert parts == [
        [
            "  prefill: fixed 20 ms, per_new_token 0.1 ms, per_pair 2e-05 ms over 8-4,200 new tokens",
            "6 samples from 6 kvtrace.engine.prefill",
        ],
        [
            "  transfer: fixed 1 ms, per_byte 2e-06 ms",
            "9 samples from 2 kvtrace.kv.transfer d2p, 7 kvtrace.kv.transfer p2d",
        ],
        [
            "  decode step: per_request 3 ms, per_step 10 ms, per_ctx_token 0.001 ms",
            "6 samples from 6 kvtrace.engine.decode",
        ],
    ]
    assert lines[4:] == [
        f"  KV: {BPT:,} bytes per token, block size {BS}",
        "  note: D's per-request cost outside its steps (3 ms) is not simulated (the simulator's decode has no "
        "per-request term)",
    ]


def test_the_fit_does_not_depend_on_the_order_the_store_returns_spans_in(tmp_path):
    # a query without ORDER BY returns rows in scan/join order (threads, files): the fit must not see it
    import pyarrow.parquet as pq

    from kvtrace.testing.synth import write_table

    build(tmp_path / "a")
    [path] = list((tmp_path / "a").rglob("*.parquet"))
    tbl = pq.read_table(path)
    rng = np.random.default_rng(7)
    for k in range(3):
        write_table(tbl.take(rng.permutation(tbl.num_rows)), tmp_path / f"b{k}")

    def fit(name):
        return {k: v for k, v in fitted(tmp_path / name).to_dict().items() if k != "source"}

    assert [fit(f"b{k}") for k in range(3)] == [fit("a")] * 3
