"""Latency by turn index, and the values two trace directories are compared on."""

from __future__ import annotations

import pytest

from kvtrace.analysis import compare, latency
from kvtrace.analysis.filters import Filters
from kvtrace.store import connect
from kvtrace.testing.synth import SpanBuilder


def _run(directory, ttfts: dict[int, list[float]], task_ms: dict[int, float]):
    """Sessions s0..sN; turn t of session i: one LLM call with ttfts[t][i], turn lasting task_ms[t]."""
    b = SpanBuilder()
    n = len(next(iter(ttfts.values())))
    for i in range(n):
        sid = f"s{i}"
        start = i * 100_000
        s = b.session(sid, start, start + 50_000)
        t0 = start
        for turn in sorted(ttfts):
            tr = b.turn(sid, turn, t0, t0 + task_ms[turn], parent=s)
            ttft = ttfts[turn][i]
            b.llm_call(sid, turn, t0 + 1, t0 + ttft + 50, ttft, parent=tr)
            t0 += task_ms[turn] + 10
    b.write(directory)
    return connect(directory)


@pytest.fixture
def baseline(tmp_path):
    return _run(tmp_path / "baseline", {0: [100.0, 300.0], 1: [200.0, 400.0]}, {0: 1000.0, 1: 2000.0})


@pytest.fixture
def candidate(tmp_path):
    return _run(tmp_path / "bidir", {0: [100.0, 300.0], 1: [50.0, 150.0]}, {0: 1000.0, 1: 1500.0})


def test_by_turn(baseline):
    rows = latency.by_turn(baseline).to_pylist()
    assert [(r["turn"], r["turns"], r["calls"]) for r in rows] == [(0, 2, 2), (1, 2, 2)]
    r1 = rows[1]
    assert (r1["ttft_p50_ms"], r1["ttft_mean_ms"], r1["task_p50_ms"]) == (300.0, 300.0, 2000.0)
    assert r1["ttft_p90_ms"] == pytest.approx(380.0)
    assert r1["latency_p50_ms"] == pytest.approx(349.0)  # llm call ends 50 ms after the first token, starts at +1
    one = latency.by_turn(baseline, Filters(session_id="s1")).to_pylist()
    assert [(r["turn"], r["ttft_p50_ms"]) for r in one] == [(0, 300.0), (1, 400.0)]


def test_values_the_comparison_reads(baseline):
    calls = latency.call_values(baseline).to_pylist()
    assert sorted((r["turn"], r["ttft_ms"], r["latency_ms"]) for r in calls) == [
        (0, 100.0, 149.0),
        (0, 300.0, 349.0),
        (1, 200.0, 249.0),
        (1, 400.0, 449.0),
    ]
    assert sorted((r["turn"], r["latency_ms"]) for r in latency.turn_values(baseline).to_pylist()) == [
        (0, 1000.0),
        (0, 1000.0),
        (1, 2000.0),
        (1, 2000.0),
    ]
    assert sorted(compare.store_values(baseline, Filters(session_id="s1"))) == [
        ("latency_ms", 0, 0, 349.0),
        ("latency_ms", 1, 0, 449.0),
        ("ttft_ms", 0, 0, 300.0),
        ("ttft_ms", 1, 0, 400.0),
        ("turn_latency_ms", 0, 0, 1000.0),
        ("turn_latency_ms", 1, 0, 2000.0),
    ]


def test_compare_runs_means(baseline, candidate):
    rows = compare.compare_runs(baseline, candidate, n_boot=200)
    ttft = {r["turn"]: r for r in rows if r["metric"] == "ttft_ms"}
    assert list(ttft) == [0, 1, compare.LATER, compare.ALL]
    assert ttft[0]["ratio"] == 1.0 and ttft[0]["verdict"] == "within noise"
    assert (ttft[1]["a_mean"], ttft[1]["b_mean"], ttft[1]["n_a"]) == (300.0, 100.0, 2)
    assert ttft[1]["ratio"] == pytest.approx(1 / 3)
    task = compare.row(rows, "turn_latency_ms", 1)
    assert task["ratio"] == 0.75


def test_compare_missing_turn_has_no_ratio(baseline, tmp_path):
    short = _run(tmp_path / "short", {0: [50.0, 50.0]}, {0: 500.0})
    rows = compare.compare_runs(baseline, short, n_boot=200)
    assert compare.row(rows, "ttft_ms", 1)["b_mean"] is None and compare.row(rows, "ttft_ms", 1)["ratio"] is None
    assert compare.row(rows, "ttft_ms", 0)["ratio"] == 0.25


def test_empty(tmp_path):
    con = connect(tmp_path, allow_empty=True)
    assert latency.by_turn(con).num_rows == 0
    assert compare.compare_runs(con, con) == []
