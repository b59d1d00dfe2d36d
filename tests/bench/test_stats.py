"""Bench statistics and CLI error handling (the A/B rule: tests/analysis/test_compare_verdicts.py)."""

from __future__ import annotations

import io

import pytest

from kvtrace import semconv as sc
from kvtrace.bench import api as bench
from kvtrace.bench import stats
from kvtrace.bench.runner import RequestRecord, SessionRecord, TurnRecord
from kvtrace.cli import main as kvtrace_main


def test_percentile_matches_linear_interpolation():
    xs = [1.0, 2.0, 3.0, 4.0]
    assert stats.percentile(xs, 50) == 2.5
    assert stats.percentile(xs, 90) == pytest.approx(3.7)
    assert stats.percentile([5.0], 99) == 5.0
    assert stats.describe([None, None]) is None
    assert stats.describe([2, 4, None]) == {
        "count": 2,
        "mean": 3.0,
        "min": 2.0,
        "max": 4.0,
        "p50": 3.0,
        "p90": 3.8,
        "p99": 3.98,
    }


def req(turn, ttft, *, rep=0, outcome=sc.OUTCOME_PULLED, error=None, interrupted=False, session="s", pulled=10):
    return RequestRecord(
        session,
        turn,
        turn,
        "t",
        0.0,
        latency_ms=ttft * 10,
        ttft_ms=ttft,
        tpot_ms=1.0,
        input_tokens=100,
        output_tokens=20,
        outcome=outcome,
        pulled_tokens=pulled,
        error=error,
        interrupted=interrupted,
        repeat=rep,
    )


def test_summarize_per_turn_and_sessions():
    requests = [
        req(0, 10, outcome=sc.OUTCOME_NO_REMOTE, pulled=0),
        req(1, 5),
        req(1, 7),
        req(1, 9, error="stream_interrupted", interrupted=True),
        req(2, 4, error="APIError", outcome=None, pulled=None),
    ]
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
    assert s["sessions"] == {
        "count": 2,
        "errors": 1,
        "wall_ms": stats.describe([100.0]),
        "active_ms": stats.describe([90.0]),
    }
    text = stats.format_summary(s, "title")
    assert text.splitlines()[0] == "title" and "pulled=3" in text


def test_api_base():
    assert bench.api_base("http://h:1") == "http://h:1/v1"
    assert bench.api_base("http://h:1/v1/") == "http://h:1/v1"
    with pytest.raises(bench.BenchError, match="must start with http"):
        bench.api_base("h:1")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("stream", "shown"), [(_Terminal(), True), (io.StringIO(), False)], ids=["tty", "file"])
def test_the_progress_line_is_written_to_a_terminal_only(stream, shown):
    bar = bench.Progress(True, 2, "A", stream)
    for _ in range(2):
        bar(RequestRecord(session="s", turn=0, call=0, label="A", start_s=0.0))
    bar.close()
    text = stream.getvalue()
    assert text.startswith("\r[A] requests 2/2 errors 0 ") and text.endswith(" \n") if shown else text == ""


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--url", "localhost:1", "--scenario", "no-reuse"], "--url must start with http"),
        (
            ["--url", "http://127.0.0.1:9", "--input", "/nonexistent.json", "--model", "m"],
            "cannot read /nonexistent.json",
        ),
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
