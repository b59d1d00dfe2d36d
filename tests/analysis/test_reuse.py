"""Reuse analysis on hand-built connector spans: tokens by source, decision mix, prefill rate,
transfer vs recompute, break-even."""

from __future__ import annotations

import pytest

from kvtrace import semconv as sc
from kvtrace.analysis import reuse
from kvtrace.analysis.filters import Filters
from kvtrace.store import connect
from kvtrace.testing.synth import SpanBuilder

P, D = "sim-p0", "sim-d0"


def _prefill(
    b,
    turn,
    start,
    *,
    prompt,
    duration,
    local_hit=0,
    remote=0,
    pulled=0,
    outcome=None,
    xfer=0.0,
    xfer_status=sc.TRANSFER_OK,
    xfer_tokens=None,
):
    """A P request of session s1: engine span, d2p decision (when ``outcome``), transfer (when ``xfer``)."""
    ident = {sc.GEN_AI_REQUEST_ID: f"r{turn}", sc.SESSION_ID: "s1", sc.TURN_INDEX: turn}
    req = b.request(
        "s1",
        turn,
        f"r{turn}",
        start,
        start + duration + 50,
        duration + 10,
        offered=bool(remote),
        offer_reason=sc.OFFER_OFFERED if remote else sc.OFFER_NO_ENTRY,
    )
    eng = b.engine(
        sc.ROLE_PREFILL,
        P,
        ident,
        start,
        start + duration,
        parent=req,
        prompt_tokens=prompt,
        cached_tokens=local_hit + pulled,
    )
    if outcome:
        dec = b.decision(
            P,
            sc.ROLE_PREFILL,
            ident,
            start,
            start + xfer,
            parent=eng,
            direction=sc.DIRECTION_D2P,
            outcome=outcome,
            prompt=prompt,
            local_hit=local_hit,
            remote=remote,
            pulled=pulled,
            recomputed=prompt - local_hit - pulled,
            peer=D,
        )
        if xfer:
            b.transfer(
                P,
                sc.ROLE_PREFILL,
                ident,
                start,
                start + xfer,
                parent=dec,
                direction=sc.DIRECTION_D2P,
                tokens=xfer_tokens if xfer_tokens is not None else pulled,
                status=xfer_status,
                peer=D,
            )


@pytest.fixture
def store(tmp_path):
    b = SpanBuilder()
    # P computes 10 tokens/ms everywhere (time minus its own transfer); transfers: 6.2 ms + 0.005 ms/token
    _prefill(b, 0, 0, prompt=1000, duration=100)
    _prefill(b, 1, 1000, prompt=1200, duration=35, remote=992, pulled=960, outcome=sc.OUTCOME_PULLED, xfer=11)
    _prefill(
        b,
        2,
        2000,
        prompt=1400,
        duration=12.6,
        local_hit=1184,
        remote=1344,
        pulled=160,
        outcome=sc.OUTCOME_PULLED,
        xfer=7,
    )
    _prefill(b, 3, 3000, prompt=1450, duration=5, local_hit=1400, remote=1440, outcome=sc.OUTCOME_BELOW_THRESHOLD)
    _prefill(
        b,
        4,
        4000,
        prompt=1600,
        duration=162,
        remote=1500,
        outcome=sc.OUTCOME_EXPIRED,
        xfer=2,
        xfer_status=sc.TRANSFER_EXPIRED,
        xfer_tokens=1500,
    )
    b.write(tmp_path)
    return connect(tmp_path)


def test_per_request_rows(store):
    rows = reuse.requests(store).to_pylist()
    assert [r["request_id"] for r in rows] == ["r1", "r2", "r3", "r4"]
    r1 = rows[0]
    assert {
        k: r1[k]
        for k in (
            "session_id",
            "turn",
            "engine_id",
            "peer_engine_id",
            "outcome",
            "prompt_tokens",
            "reusable_tokens",
            "local_hit_tokens",
            "pulled_tokens",
            "recomputed_tokens",
            "bytes",
            "substrate",
        )
    } == {
        "session_id": "s1",
        "turn": 1,
        "engine_id": P,
        "peer_engine_id": D,
        "outcome": sc.OUTCOME_PULLED,
        "prompt_tokens": 1200,
        "reusable_tokens": 992,
        "local_hit_tokens": 0,
        "pulled_tokens": 960,
        "recomputed_tokens": 240,
        "bytes": 60 * 16 * 262_144,
        "substrate": sc.SUBSTRATE_SIM,
    }
    assert r1["transfer_ms"] == pytest.approx(11.0)
    assert r1["recompute_est_ms"] == pytest.approx(96.0)  # 960 tokens at 10 tokens/ms
    assert rows[1]["recompute_est_ms"] == pytest.approx(16.0)
    assert rows[2]["transfer_ms"] is None and rows[2]["recompute_est_ms"] == 0
    assert rows[3]["outcome"] == sc.OUTCOME_EXPIRED and rows[3]["pulled_tokens"] == 0
    assert reuse.requests(store, limit=2).num_rows == 2
    assert [r["turn"] for r in reuse.requests(store, Filters(substrate=sc.SUBSTRATE_VLLM)).to_pylist()] == []


def test_prefill_rate_subtracts_transfer_time(store):
    rates = {r["engine_id"]: r for r in reuse.prefill_rates(store)}
    assert set(rates) == {None, P}
    assert rates[P]["requests"] == 5
    assert rates[P]["computed_tokens"] == 1000 + 240 + 56 + 50 + 1600
    assert rates[P]["tokens_per_ms"] == pytest.approx(10.0)


def test_break_even(store):
    rows = {r["engine_id"]: r for r in reuse.break_even(store)}
    row = rows[P]
    assert row["transfers"] == 2  # the expired read is not a transfer cost sample
    assert row["overhead_ms"] == pytest.approx(6.2)
    assert row["xfer_ms_per_token"] == pytest.approx(0.005)
    assert row["recompute_ms_per_token"] == pytest.approx(0.1)
    assert row["break_even_tokens"] == 66  # ceil(6.2 / 0.095)
    assert rows[None]["break_even_tokens"] == 66


def test_summary_and_mixes(store):
    s = reuse.summary(store)
    assert {
        k: s[k]
        for k in (
            "decisions",
            "pulled_requests",
            "prompt_tokens",
            "reusable_tokens",
            "local_hit_tokens",
            "pulled_tokens",
            "recomputed_tokens",
            "bytes",
            "break_even_tokens",
        )
    } == {
        "decisions": 4,
        "pulled_requests": 2,
        "prompt_tokens": 1200 + 1400 + 1450 + 1600,
        "reusable_tokens": 992 + 1344 + 1440 + 1500,
        "local_hit_tokens": 1184 + 1400,
        "pulled_tokens": 1120,
        "recomputed_tokens": 240 + 56 + 50 + 1600,
        "bytes": (60 + 10) * 16 * 262_144,
        "break_even_tokens": 66,
    }
    assert s["transfer_ms"] == pytest.approx(18.0)
    assert s["recompute_est_ms"] == pytest.approx(112.0)
    assert s["saved_ms"] == pytest.approx(94.0)
    assert s["pull_rate"] == 0.5
    mix = reuse.decision_mix(store).to_pylist()
    assert [(r["direction"], r["outcome"], r["decisions"]) for r in mix] == [
        (sc.DIRECTION_D2P, sc.OUTCOME_PULLED, 2),
        (sc.DIRECTION_D2P, sc.OUTCOME_BELOW_THRESHOLD, 1),
        (sc.DIRECTION_D2P, sc.OUTCOME_EXPIRED, 1),
    ]
    offers = {r["offer_reason"]: r["requests"] for r in reuse.offer_mix(store).to_pylist()}
    assert offers == {sc.OFFER_OFFERED: 4, sc.OFFER_NO_ENTRY: 1}


def test_tokens_by_source_per_turn(store):
    got = [
        (r["turn"], r["local_hit_tokens"], r["pulled_tokens"], r["computed_tokens"])
        for r in reuse.tokens_by_source(store).to_pylist()
    ]
    assert got == [(0, 0, 0, 1000), (1, 0, 960, 240), (2, 1184, 160, 56), (3, 1400, 0, 50), (4, 0, 0, 1600)]


def test_empty_store(tmp_path):
    con = connect(tmp_path, allow_empty=True)
    s = reuse.summary(con)
    assert (s["decisions"], s["pulled_tokens"], s["pull_rate"], s["break_even_tokens"]) == (0, 0, None, None)
    assert reuse.requests(con).num_rows == 0 and reuse.tokens_by_source(con).num_rows == 0


def test_prefills_of_one_size_are_priced_at_their_mean_rate(tmp_path):
    # no line through points of one x: DuckDB's slope is NaN, which it orders above 0
    b = SpanBuilder()
    for turn, duration in enumerate((30.0, 25.0, 35.0)):
        _prefill(b, turn, 1000 * turn, prompt=300, duration=duration)
    b.write(tmp_path)
    con = connect(tmp_path)
    rates = {r["engine_id"]: r for r in reuse.prefill_rates(con)}
    assert rates[P]["requests"] == 3 and rates[P]["tokens_per_ms"] == pytest.approx(900 / 90.0)
    assert rates[None]["tokens_per_ms"] == pytest.approx(10.0)


def test_the_store_rates_follow_its_files(tmp_path):
    """Computed once per listing of the files, as the bounds of a range: a re-listing (the dashboard's
    Refresh) prices and bounds the new ones."""
    from kvtrace.analysis.common import rows
    from kvtrace.store.reader import refresh

    b = SpanBuilder()
    for turn, (prompt, duration) in enumerate(((1000, 100.0), (1400, 120.0), (1800, 150.0))):
        _prefill(b, turn, 1000 * turn, prompt=prompt, duration=duration)
    b.write(tmp_path)
    con = connect(tmp_path)
    by_views = "ORDER BY engine_id NULLS FIRST"
    first = reuse.prefill_rates(con)
    assert first == rows(con, f"{reuse.PREFILL_RATE_SQL} {by_views}") and reuse.prefill_rates(con) == first
    _prefill(b, 3, 5000, prompt=3000, duration=400.0)
    b.write(tmp_path)
    later = Filters(start_ns=b.ns(4000))  # bounds found before the new file was listed, then after
    assert reuse.prefill_rates(con) == first and reuse.tokens_by_source(con, later).num_rows == 0
    refresh(con)
    assert [r["computed_tokens"] for r in reuse.tokens_by_source(con, later).to_pylist()] == [3000]
    got = reuse.prefill_rates(con)
    assert got != first and got == rows(con, f"{reuse.PREFILL_RATE_SQL} {by_views}")
    assert {r["engine_id"]: r["requests"] for r in got} == {None: 4, P: 4}
    assert reuse.break_even(con) == rows(con, reuse.BREAK_EVEN_SQL)
