"""One comparison rule (kvtrace.analysis.compare): bootstrap intervals vs repeat noise, and the
same verdicts from ``kvtrace bench``, ``kvtrace demo``, ``kvtrace report`` and the dashboard on the
same data."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from kvtrace import semconv as sc
from kvtrace.analysis import compare
from kvtrace.analysis.report import document as report
from kvtrace.analysis.report import text
from kvtrace.bench import stats
from kvtrace.bench.runner import RequestRecord, TurnRecord
from kvtrace.demo import summary as demo
from kvtrace.store import connect
from kvtrace.testing.synth import SpanBuilder


def req(turn, ttft, *, rep=0, latency=None, error=None):
    return RequestRecord(
        "s",
        turn,
        turn,
        "t",
        0.0,
        latency_ms=latency if latency is not None else ttft * 10,
        ttft_ms=ttft,
        tpot_ms=1.0,
        input_tokens=100,
        output_tokens=20,
        outcome=sc.OUTCOME_PULLED,
        pulled_tokens=10,
        error=error,
        repeat=rep,
    )


class Result:
    def __init__(self, requests, turns=()):
        self.requests, self.turns = list(requests), list(turns)


def side(ttfts_by_turn, rep_scale=(1.0,), seed=0):
    r = random.Random(seed)
    out = []
    for rep, scale in enumerate(rep_scale):
        for turn, base in ttfts_by_turn.items():
            out += [req(turn, base * scale * r.uniform(0.95, 1.05), rep=rep) for _ in range(30)]
    return Result(out)


def rows_of(a, b, metric="ttft_ms", **kw):
    return {r["turn"]: r for r in compare.compare(stats.values(a), stats.values(b), **kw) if r["metric"] == metric}


def test_marks_real_differences_only():
    a = side({0: 100, 1: 100}, rep_scale=(1.0, 1.01), seed=1)
    b = side({0: 100, 1: 50}, rep_scale=(1.0, 1.01), seed=2)
    r = rows_of(a, b, n_boot=300)
    assert r[1]["ratio"] == pytest.approx(0.5, rel=0.05) and r[1]["significant"] and r[1]["verdict"] == "faster"
    assert r[1]["ci_high"] < 1.0
    assert r[0]["ratio"] == pytest.approx(1.0, rel=0.05) and r[0]["verdict"] == "within noise"
    assert r[0]["ci_low"] <= 1.0 <= r[0]["ci_high"]
    assert (r[compare.ALL]["n_a"], r[compare.LATER]["n_a"]) == (120, 60)
    assert r[compare.LATER]["a_mean"] == pytest.approx(sum(x.ttft_ms for x in a.requests if x.turn == 1) / 60)
    assert rows_of(b, a, n_boot=300)[1]["verdict"] == "slower"


def test_respects_repeat_noise():
    # B is 20 % faster inside each repeat's tight spread, but the repeats differ by 2x
    a = side({0: 100}, rep_scale=(0.7, 1.4), seed=3)
    b = side({0: 80}, rep_scale=(0.7, 1.4), seed=4)
    r = rows_of(a, b, n_boot=300)[0]
    assert r["noise"] > abs(math.log(r["ratio"]))
    assert not r["significant"] and r["verdict"] == "within noise"
    single = rows_of(side({0: 100}, seed=5), side({0: 80}, seed=6), n_boot=300)[0]
    assert single["noise"] is None and single["significant"] and single["verdict"] == "faster"


def test_turn_latency_uses_turn_records_and_skips_failures():
    a = Result(
        [req(0, 10), req(0, 12, error="APIError")],
        [TurnRecord("s", 0, "x", 100.0), TurnRecord("s", 0, "x", 120.0), TurnRecord("s", 0, "x", 1.0, error="x")],
    )
    b = Result([req(0, 10)], [TurnRecord("s", 0, "x", 50.0), TurnRecord("s", 0, "x", 70.0)])
    r = rows_of(a, b, "turn_latency_ms", n_boot=50)[0]
    assert (r["a_mean"], r["b_mean"], r["ratio"]) == (110.0, 60.0, pytest.approx(60 / 110))
    assert rows_of(a, b, "latency_ms", n_boot=50)[0]["n_a"] == 1  # a failed request has no latency
    assert rows_of(a, b, "ttft_ms", n_boot=50)[0]["n_a"] == 2  # ... but its TTFT counts
    assert "turn_latency_ms" in stats.format_comparison(compare.compare(stats.values(a), stats.values(b), n_boot=50))


def test_reproducible_and_independent_of_order():
    a, b = side({0: 100, 1: 90}, seed=7), side({0: 100, 1: 80}, seed=8)
    va, vb = stats.values(a), stats.values(b)
    first = compare.compare(va, vb, seed=3)
    assert compare.compare(list(reversed(va)), random.Random(1).sample(vb, len(vb)), seed=3) == first
    assert compare.compare(va, vb, seed=4) != first  # the seed is what draws the resamples


def test_a_run_without_values_has_no_verdict():
    r = rows_of(Result([req(0, 10)]), Result([req(1, 10)]), n_boot=50)
    assert (r[0]["verdict"], r[0]["n_b"], r[1]["verdict"], r[1]["n_a"]) == ("–", 0, "–", 0)
    assert compare.compare([], []) == []


# -- the four consumers agree ---------------------------------------------------------------------
TTFT = {  # turn -> (baseline, candidate) mean TTFT, ms; each session adds its own offset
    0: (100, 100),
    1: (400, 150),
    2: (400, 395),
}
SESSIONS = 8


def _calls(run: int):
    """(session, turn, ttft ms, call latency ms, turn latency ms) of one run, integers only (exact in
    spans and records alike)."""
    rng = random.Random(run)
    out = []
    for s in range(SESSIONS):
        for turn, means in TTFT.items():
            ttft = means[run] + rng.randint(-20, 20)
            out.append((f"s{s}", turn, ttft, ttft + 200 + rng.randint(0, 50), ttft + 600 + rng.randint(0, 100)))
    return out


def _store(directory: Path, run: int) -> None:
    b = SpanBuilder()
    t = 0.0
    for sid, turn, ttft, latency, turn_latency in _calls(run):
        tr = b.turn(sid, turn, t, t + turn_latency)
        b.llm_call(sid, turn, t + 10, t + 10 + latency, ttft, parent=tr)
        t += turn_latency + 1000
    b.write(directory)


def _records(run: int) -> Result:
    calls = _calls(run)
    return Result(
        [req(turn, float(ttft), latency=float(latency)) for _, turn, ttft, latency, _ in calls],
        [TurnRecord(sid, turn, "x", float(tl)) for sid, turn, _, _, tl in calls],
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cmp")
    _store(root / "baseline", 0)
    _store(root / "candidate", 1)
    return root


def _verdicts(rows, metric="ttft_ms"):
    return {str(r["turn"]): r["verdict"] for r in rows if r["metric"] == metric}


def test_bench_demo_report_and_dashboard_give_the_same_verdicts(runs, monkeypatch):
    base, cand = connect(runs / "baseline"), connect(runs / "candidate")
    rows = compare.compare_runs(base, cand)
    # kvtrace bench (records of the same calls)
    assert compare.compare(stats.values(_records(0)), stats.values(_records(1))) == rows
    verdicts = _verdicts(rows)
    assert verdicts["1"] == "faster" and verdicts["0"] == "within noise"  # the data says so
    # kvtrace demo: its TTFT table
    out = "\n".join(demo.comparison_sections(base, cand, 1.0))
    table = [
        line.split("|")
        for line in out.split("== Mean TTFT by turn index", 1)[1].split("\n\n")[0].splitlines()
        if line.startswith("|")
    ][2:]
    shown = {c[1].strip().replace(text.LATER_LABEL, compare.LATER): c[-2].strip() for c in table}
    assert shown == {k: v for k, v in verdicts.items() if k != compare.ALL}
    assert f": {verdicts[compare.LATER]})" in " ".join(out.split("\n\n")[-1].split())  # the result paragraph
    # kvtrace report --compare
    doc, _ = report.build(
        cand, str(runs / "candidate"), compare_con=base, compare_dir=str(runs / "baseline"), plots=False
    )
    md = report.to_markdown(doc, {})
    section = md.split("## Comparison with", 1)[1]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines() if line.startswith("| ")]
    assert {(c[0], c[1]): c[-1] for c in cells[1:]} == {(r["metric"], str(r["turn"])): r["verdict"] for r in rows}
    # the dashboard's run comparison page
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("KVTRACE_TRACES_DIR", str(runs / "candidate"))
    monkeypatch.setenv("KVTRACE_COMPARE_DIR", str(runs / "baseline"))
    app = Path(__file__).resolve().parents[2] / "dashboards" / "app.py"
    at = AppTest.from_file(str(app), default_timeout=60).run()
    at.switch_page("app_pages/compare.py").run()
    assert not at.exception and not at.error
    frame = at.dataframe[0].value
    assert {(m, t): v for m, t, v in zip(frame["metric"], frame["turn"], frame["verdict"], strict=True)} == {
        (r["metric"], str(r["turn"])): r["verdict"] for r in rows
    }
