"""Bench statistics, the A/B noise test, and CLI error handling."""

from __future__ import annotations

import math
import random

import pytest

from kvtrace import semconv as sc
from kvtrace.bench import bench, stats
from kvtrace.bench.runner import RequestRecord, SessionRecord, TurnRecord
from kvtrace.cli import main as kvtrace_main


def test_percentile_matches_linear_interpolation():
    xs = [1.0, 2.0, 3.0, 4.0]
    assert stats.percentile(xs, 50) == 2.5
    assert stats.percentile(xs, 90) == pytest.approx(3.7)
    assert stats.percentile([5.0], 99) == 5.0
    assert stats.describe([None, None]) is None
    assert stats.describe([2, 4, None]) == {"count": 2, "mean": 3.0, "min": 2.0, "max": 4.0, "p50": 3.0, "p90": 3.8, "p99": 3.98}


def req(turn, ttft, *, rep=0, outcome=sc.OUTCOME_PULLED, error=None, interrupted=False, session="s", pulled=10):
    return RequestRecord(session, turn, turn, "t", 0.0, latency_ms=ttft * 10, ttft_ms=ttft, tpot_ms=1.0,
                         input_tokens=100, output_tokens=20, outcome=outcome, pulled_tokens=pulled,
                         error=error, interrupted=interrupted, repeat=rep)


def test_summarize_per_turn_and_sessions():
    requests = [req(0, 10, outcome=sc.OUTCOME_NO_REMOTE, pulled=0), req(1, 5), req(1, 7),
                req(1, 9, error="stream_interrupted", interrupted=True), req(2, 4, error="APIError", outcome=None, pulled=None)]
    turns = [TurnRecord("s", 0, "a", 100.0), TurnRecord("s", 1, "b", 50.0), TurnRecord("s", 2, "b", 5.0, error="x")]
    sessions = [SessionRecord("s", "n", 200.0, 150.0, 3, 5, error="x"), SessionRecord("u", "n", 100.0, 90.0, 1, 1)]
    s = stats.summarize(requests, turns, sessions)
    assert s["requests"]["count"] == 5 and s["requests"]["errors"] == 1 and s["requests"]["interrupted"] == 1
    assert s["requests"]["outcomes"] == {sc.OUTCOME_NO_REMOTE: 1, sc.OUTCOME_PULLED: 3, "none": 1}
    assert s["requests"]["pulled_tokens"] == 30
    assert s["requests"]["latency_ms"]["count"] == 3  # failed and interrupted requests have no latency
    assert s["requests"]["ttft_ms"]["count"] == 5
    assert [t["turn"] for t in s["per_turn"]] == [0, 1, 2]
    t1 = s["per_turn"][1]
    assert t1["requests"] == 3 and t1["ttft_ms"]["p50"] == 7.0 and t1["turn_latency_ms"]["p50"] == 50.0
    assert s["per_turn"][2]["turn_latency_ms"] is None
    assert s["sessions"] == {"count": 2, "errors": 1, "wall_ms": stats.describe([100.0]), "active_ms": stats.describe([90.0])}
    text = stats.format_summary(s, "title")
    assert text.splitlines()[0] == "title" and "pulled=3" in text


class FakeResult:
    def __init__(self, requests, turns=()):
        self.requests, self.turns = list(requests), list(turns)


def side(ttfts_by_turn, rep_scale=(1.0,), seed=0):
    r = random.Random(seed)
    out = []
    for rep, scale in enumerate(rep_scale):
        for turn, base in ttfts_by_turn.items():
            out += [req(turn, base * scale * r.uniform(0.95, 1.05), rep=rep) for _ in range(30)]
    return FakeResult(out)


def rows(result, metric="ttft_ms"):
    return {r["turn"]: r for r in result if r["metric"] == metric}


def test_compare_marks_real_differences_only():
    a = side({0: 100, 1: 100}, rep_scale=(1.0, 1.01), seed=1)
    b = side({0: 100, 1: 50}, rep_scale=(1.0, 1.01), seed=2)
    r = rows(stats.compare(a, b, seed=0, n_boot=300))
    assert r[1]["ratio"] == pytest.approx(0.5, rel=0.05) and r[1]["significant"]
    assert r[1]["ci_high"] < 1.0
    assert r[0]["ratio"] == pytest.approx(1.0, rel=0.05) and not r[0]["significant"]
    assert r[0]["ci_low"] <= 1.0 <= r[0]["ci_high"]
    assert r[None]["n_a"] == 120 and r[None]["n_b"] == 120


def test_compare_respects_repeat_noise():
    # B is 20 % faster inside each repeat's tight spread, but A's repeats differ by 2x
    a = side({0: 100}, rep_scale=(0.7, 1.4), seed=3)
    b = side({0: 80}, rep_scale=(0.7, 1.4), seed=4)
    r = rows(stats.compare(a, b, seed=0, n_boot=300))[0]
    assert r["noise"] > abs(math.log(r["ratio"]))
    assert not r["significant"]
    single = rows(stats.compare(side({0: 100}, seed=5), side({0: 80}, seed=6), seed=0, n_boot=300))[0]
    assert single["noise"] is None and single["significant"]


def test_compare_turn_latency_uses_turn_records():
    a = FakeResult([req(0, 10)], [TurnRecord("s", 0, "x", 100.0), TurnRecord("s", 0, "x", 120.0)])
    b = FakeResult([req(0, 10)], [TurnRecord("s", 0, "x", 50.0), TurnRecord("s", 0, "x", 70.0)])
    r = rows(stats.compare(a, b, n_boot=50), "turn_latency_ms")[0]
    assert (r["a_p50"], r["b_p50"], r["ratio"]) == (110.0, 60.0, pytest.approx(60 / 110))
    assert "turn_latency_ms" in stats.format_comparison(stats.compare(a, b, n_boot=50))


def test_api_base():
    assert bench.api_base("http://h:1") == "http://h:1/v1"
    assert bench.api_base("http://h:1/v1/") == "http://h:1/v1"
    with pytest.raises(bench.BenchError, match="must start with http"):
        bench.api_base("h:1")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--url", "localhost:1", "--scenario", "no-reuse"], "--url must start with http"),
        (["--url", "http://127.0.0.1:9", "--input", "/nonexistent.json", "--model", "m"], "cannot read /nonexistent.json"),
        (["--url", "http://127.0.0.1:9", "--scenario", "no-reuse", "--clients", "0"], "clients must be >= 1"),
        (["--url", "http://127.0.0.1:9", "--scenario", "no-reuse"], "cannot list models at http://127.0.0.1:9"),
    ],
)
def test_cli_errors_are_one_line(argv, message, capsys):
    assert kvtrace_main(["bench", "--no-progress", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kvtrace bench: error: ") and message in err[0]


def test_unknown_bench_option_is_a_bench_error():
    with pytest.raises(bench.BenchError, match="unexpected keyword"):
        bench.run_bench("http://127.0.0.1:9", scenario="no-reuse", clientz=3)
