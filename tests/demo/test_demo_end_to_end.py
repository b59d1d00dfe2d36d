"""``kvtrace demo`` end to end: simulator + proxy + agent workload, twice; traces written; the
printed numbers are the views' numbers (the verdicts: kvtrace.analysis.compare).  Plus the demo workload's shape."""

from __future__ import annotations

import math
import re

import pytest

from kvtrace import semconv as sc
from kvtrace.analysis import compare, retention, reuse, sessions
from kvtrace.analysis.report.text import LATER_LABEL, ci, ms, num, ratio
from kvtrace.bench.scenarios import LLM
from kvtrace.bench.workload import LLMAction, ToolAction
from kvtrace.cli import demo as demo_cli
from kvtrace.cli import main
from kvtrace.demo import run as demo
from kvtrace.demo.run import SCENARIOS
from kvtrace.store import connect
from kvtrace.store.views.breakdown import PART_COLUMNS

from support import plain_parquet

pytest.importorskip("aiohttp")
pytest.importorskip("openai")


def _cell(out: str, label: str) -> str:
    m = re.search(rf"^\| {re.escape(label)} +\| ([^|]+?) +\|", out, re.M)
    assert m, f"no row {label!r} in:\n{out}"
    return m.group(1)


def _table(out: str, heading: str) -> list[list[str]]:
    """Body rows (cells stripped) of the first Markdown table after ``heading``."""
    lines = out.split(heading, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    body = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        body.append([c.strip() for c in line.strip("|").split("|")])
    return body


def _model_s(wall_ms: float, scale: float) -> str:
    return f"{wall_ms * scale / 1e3:,.2f}"


@pytest.mark.timeout(240)
def test_writes_both_runs(demo_run):
    rc, out, root = demo_run
    assert rc == 0, out
    for run in ("bidir", "baseline"):
        assert list((root / run).rglob("*.parquet")), run
    bidir, base = connect(root / "bidir"), connect(root / "baseline")
    expected = {f"demo-A0-{name}-{i}" for name in SCENARIOS for i in range(2)}
    assert {r["session_id"] for r in sessions.breakdown(bidir).to_pylist()} == expected
    assert {r["session_id"] for r in sessions.breakdown(base).to_pylist()} == expected
    outcomes = {r["outcome"] for r in reuse.requests(bidir).to_pylist()}
    assert sc.OUTCOME_PULLED in outcomes and sc.OUTCOME_BELOW_THRESHOLD in outcomes
    assert sc.OUTCOME_PULLED not in {r["outcome"] for r in reuse.requests(base).to_pylist()}
    # the paused session's turn after the pause finds nothing on D in either run
    resumed = [r for r in reuse.requests(bidir).to_pylist() if r["session_id"] == "demo-A0-pause-resume-0"]
    assert [r["outcome"] for r in resumed if r["turn"] == 2] in ([sc.OUTCOME_NO_REMOTE], [sc.OUTCOME_EXPIRED])
    assert f"kvtrace dashboard --traces {root / 'bidir'} --compare {root / 'baseline'}" in out
    assert f"decoder_kv_blocks_ttl {demo.TTL_S:g} s" in out and f"compressed {demo.DEFAULT_TIME_SCALE:g}x" in out


@pytest.mark.timeout(240)
def test_traces_at_rest_are_plain_parquet(demo_run):
    """Every writer of the demo has exited: a plain recursive glob counts each span once."""
    rc, out, root = demo_run
    for run in ("bidir", "baseline"):
        ((n,),) = connect(root / run).execute("SELECT count(*) FROM spans").fetchall()
        assert n > 100 and plain_parquet.counts(root / run) == {r: (n, n) for r in ("duckdb", "pyarrow", "chdb")}


@pytest.mark.timeout(240)
def test_printed_numbers_match_the_views(demo_run):
    rc, out, root = demo_run
    bidir = connect(root / "bidir")
    tot = sessions.totals(bidir)
    for label, col in (
        ("input processing", "input_processing_ms"),
        ("generation", "generation_ms"),
        ("tool waits", "tool_wait_ms"),
        ("app work", "app_work_ms"),
        ("user pauses", "user_pause_ms"),
        ("wall time", "wall_ms"),
    ):
        assert _cell(out, label) == ms(tot[col]), label
    # the paused sessions' pauses are the users' (> 2 x 60 model s / 5), not app work
    assert tot["user_pause_ms"] > 2 * demo.RESUME_PAUSE_S / demo.DEFAULT_TIME_SCALE * 1e3 > tot["app_work_ms"]
    longest = {r[0]: r for r in _table(out, "Longest sessions:")}
    for r in sessions.breakdown(bidir, limit=12).to_pylist():
        assert longest[r["session_id"]][2:] == [ms(r[c]) for c in ("wall_ms", *PART_COLUMNS)]
    s = reuse.summary(bidir)
    assert _cell(out, "pulled tokens") == num(s["pulled_tokens"])
    assert _cell(out, "P reuse decisions (d2p)") == num(s["decisions"])
    (held,) = retention.summary(bidir)
    assert _cell(out, held["engine_id"]) == num(held["retained"])
    assert _table(out, "KV held on D")[0][1:5] == [num(held[k]) for k in ("retained", "read", "expired", "released")]


@pytest.mark.timeout(240)
def test_printed_ttft_table_matches_the_views(demo_run):
    rc, out, root = demo_run
    bidir, base = connect(root / "bidir"), connect(root / "baseline")
    scale = demo.DEFAULT_TIME_SCALE
    table = _table(out, "== Mean TTFT by turn index")
    rows = [r for r in compare.compare_runs(base, bidir) if r["metric"] == "ttft_ms" and r["turn"] != compare.ALL]
    assert [r[0] for r in table] == [str(r["turn"]) for r in rows[:-1]] + [LATER_LABEL]
    for printed, row in zip(table, rows, strict=True):
        b, c = row["a_mean"], row["b_mean"]
        assert printed[1:] == [
            num(row["n_b"]),
            ms(b),
            ms(c),
            ratio(row["ratio"]),
            ci(row),
            f"{_model_s(b, scale)} → {_model_s(c, scale)}",
            row["verdict"],
        ]
    # the pooled row is the plain mean over every call at turn >= 1, computed here from the view
    pooled = {}
    for name, con in (("baseline", base), ("bidir", bidir)):
        pooled[name] = con.sql("SELECT count(*), avg(ttft_ms) FROM llm_calls WHERE turn >= 1").fetchall()[0]
    (n, b_mean), (_, c_mean) = pooled["baseline"], pooled["bidir"]
    assert table[-1][:6] == [LATER_LABEL, num(n), ms(b_mean), ms(c_mean), ratio(c_mean / b_mean), ci(rows[-1])]
    assert f"(ratio {ratio(c_mean / b_mean)}, 95% CI {ci(rows[-1])}: {rows[-1]['verdict']})" in " ".join(out.split())
    # completed-turn latency: the same rule on the turn_latency_ms rows
    turns = [
        r for r in compare.compare_runs(base, bidir) if r["metric"] == "turn_latency_ms" and r["turn"] != compare.ALL
    ]
    assert [r[-1] for r in _table(out, "== Mean completed-turn latency")] == [r["verdict"] for r in turns]


@pytest.mark.timeout(240)
def test_printed_prefill_work_matches_the_views(demo_run):
    rc, out, root = demo_run
    bidir, base = connect(root / "bidir"), connect(root / "baseline")
    table = _table(out, "== Prefill work on P")
    assert len(table[0]) == 6
    b_tok = {r["turn"]: r for r in reuse.tokens_by_source(base).to_pylist()}
    c_tok = {r["turn"]: r for r in reuse.tokens_by_source(bidir).to_pylist()}
    assert [r[0] for r in table] == [str(t) for t in sorted(c_tok)]
    for printed in table:
        b, c = b_tok[int(printed[0])], c_tok[int(printed[0])]
        prompt = (c["local_hit_tokens"] + c["pulled_tokens"] + c["computed_tokens"]) / c["requests"]
        assert printed[1:6] == [
            f"{prompt:,.0f}",
            f"{b['computed_tokens'] / b['requests']:,.0f}",
            f"{c['computed_tokens'] / c['requests']:,.0f}",
            f"{c['pulled_tokens'] / c['requests']:,.0f}",
            f"{c['local_hit_tokens'] / c['requests']:,.0f}",
        ]
    assert table[0][4] == "0"  # turn 0: nothing to pull


@pytest.mark.timeout(240)
def test_printed_saved_work_table_matches_the_views(demo_run):
    """Calls paired across the runs, grouped by what the baseline's P computed more (here from the
    engine prefill spans rather than the kv decisions the table reads)."""
    rc, out, root = demo_run
    sql = (
        "SELECT l.session_id, l.turn, l.ttft_ms, e.prompt_tokens - e.cached_tokens FROM llm_calls l "
        f"JOIN engine_requests e ON e.request_id = l.request_id AND e.phase = '{sc.ROLE_PREFILL}' WHERE l.turn >= 1"
    )
    calls = {
        run: {(r[0], r[1]): r[2:] for r in connect(root / run).sql(sql).fetchall()} for run in ("baseline", "bidir")
    }
    assert calls["baseline"].keys() == calls["bidir"].keys()
    pairs = [
        (calls["baseline"][k][1] - calls["bidir"][k][1], calls["baseline"][k][0], calls["bidir"][k][0])
        for k in calls["baseline"]
    ]
    table = _table(out, "== Mean TTFT by prompt tokens")
    assert [r[0] for r in table] == ["< 1,000", "1,000 – 5,000", "≥ 5,000"]
    for printed, (lo, hi) in zip(table, ((-math.inf, 1000), (1000, 5000), (5000, math.inf)), strict=True):
        group = [p for p in pairs if lo <= p[0] < hi]
        assert printed[1] == num(len(group))
        if group:
            b, c = sum(g[1] for g in group) / len(group), sum(g[2] for g in group) / len(group)
            assert printed[2:6] == [f"{sum(g[0] for g in group) / len(group):,.0f}", ms(b), ms(c), ratio(c / b)]
            assert printed[6] == f"{_model_s(b, demo.DEFAULT_TIME_SCALE)} → {_model_s(c, demo.DEFAULT_TIME_SCALE)}"
    assert sum(int(r[1]) for r in table) == len(pairs)


@pytest.mark.timeout(240)
def test_output_fits_120_columns(demo_run):
    rc, out, root = demo_run
    wide = [line for line in out.splitlines() if len(line) > 120 and not line.startswith("Open the dashboard:")]
    assert wide == []
    assert out.count("\n| ") >= 40  # the tables are there


def test_workload_is_agent_sized_with_one_call_per_turn():
    runs = demo.workload(2, seed=0)
    names = [w.name for w in runs]
    assert names == [n for n in SCENARIOS for _ in range(2)]  # start order: longest scenario first
    assert [s.name for w in runs for s in w.sessions] == [f"{n}-{i}" for n in SCENARIOS for i in range(2)]
    for w in runs:
        (plan,) = w.sessions
        assert 1800 <= len(plan.system_text.split()) <= 2200, w.name
        assert all(sum(isinstance(a, LLMAction) for a in t.actions) == 1 for t in plan.turns), w.name
    for scenario in demo.scenarios():
        assert all(sum(isinstance(s, LLM) for s in spec.steps) == 1 for spec in scenario.turns), scenario.name
    paused = next(w.sessions[0] for w in runs if w.name == "pause-resume")
    assert [t.pause_s for t in paused.turns][2] == demo.RESUME_PAUSE_S > demo.TTL_S
    coding = next(w.sessions[0] for w in runs if w.name == "coding-agent")
    first = sum(len(c.output.split()) for a in coding.turns[0].actions if isinstance(a, ToolAction) for c in a.calls)
    assert first >= 9000  # three files of 3-5k tokens


def test_bad_arguments(tmp_path, capsys):
    assert main(["demo", "--traces", str(tmp_path), "--sessions", "0"]) == 2
    assert "--sessions" in capsys.readouterr().err
    (tmp_path / "bidir").mkdir()
    (tmp_path / "bidir" / "notes.txt").write_text("mine")
    assert main(["demo", "--traces", str(tmp_path)]) == 2
    assert "other than Parquet" in capsys.readouterr().err
    assert (tmp_path / "bidir" / "notes.txt").exists()


@pytest.mark.parametrize("where", ["under-a-file", "read-only-fs"])
def test_unwritable_traces_end_the_demo_at_once_in_one_line(tmp_path, capsys, monkeypatch, where):
    """Checked before anything starts: no run, no export errors, one line naming the directory."""
    import os

    if where == "under-a-file":
        (tmp_path / "file").write_text("x")
        target, reason = tmp_path / "file" / "traces", "Not a directory"
    else:  # sysfs refuses new directories even to root
        if not os.path.isdir("/sys/kernel") or os.access("/sys/kernel", os.W_OK) and os.geteuid() != 0:
            pytest.skip("no read-only sysfs")
        target, reason = "/sys/kernel/kvtrace-traces", os.strerror(1)  # EPERM: Operation not permitted
    monkeypatch.setattr(demo, "run_both", lambda *a, **k: pytest.fail("the runs started"))
    assert main(["demo", "--traces", str(target)]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"kvtrace demo: error: cannot write traces to {target}: {reason}\n")


@pytest.mark.parametrize(
    "turn0, warned", [(compare.WITHIN_NOISE, False), (compare.FASTER, True), (compare.SLOWER, True)]
)
def test_result_warns_when_turn_0_is_not_within_noise(turn0, warned):
    """Nothing can be reused at turn 0, so a verdict there means the runs were disturbed."""
    from kvtrace.demo.summary import conclusion

    def r(turn, ratio_, verdict):
        return {
            "metric": "ttft_ms",
            "turn": turn,
            "n_a": 12,
            "n_b": 12,
            "a_mean": 1000.0,
            "b_mean": 1000.0 * ratio_,
            "ratio": ratio_,
            "ci_low": ratio_ - 0.1,
            "ci_high": ratio_ + 0.1,
            "verdict": verdict,
        }

    line = conclusion([r(0, 0.5, turn0), r(compare.LATER, 0.7, compare.FASTER)], [], 5.0)
    assert line.startswith(
        "Result: over 12 LLM calls at turns >= 1, mean TTFT 5.00 model s without bidirectional "
        "reuse -> 3.50 with it (ratio 0.70, 95% CI 0.60–0.80: faster); turn 0 (nothing to reuse): "
        f"ratio 0.50, {turn0}"
    )
    assert ("rerun before trusting this comparison" in line) is warned


def test_readme_and_demo_help_give_the_same_duration():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    said = re.search(r"It takes about (\d+) s on 2 cores", readme)
    assert said and f"about {said.group(1)} s on 2 cores" in " ".join(demo_cli.run.__doc__.split())
