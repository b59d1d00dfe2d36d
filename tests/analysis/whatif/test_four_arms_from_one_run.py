"""The four arms of ``kvtrace bench --arms`` from one recorded run (kvtrace.analysis.whatif.arms),
checked against the four arms run for real on the simulator (one small long-context workload).

Decisions are exact: each arm's pulls, pulled and computed tokens equal the real run's, from the
production run (P cache on, bidirectional on) and from the published one (P cache off, bidirectional
on).  TTFT: the recorded arm's mean is the recorded one exactly; from the run without reverse
transfer (P cache off: the deployment asking what it would save), what reverse transfer saves in
the published setup (mean TTFT with it off minus on) is within 30 % of what the real runs show, and
each arm's mean TTFT within 35 % of its real run's.  (A run with P's cache and reverse transfer on
computes ~200 new tokens per prefill after its first: its fit cannot price a 12,000-token
recompute, and the arms say so in a note.)  Why those bounds: the counterfactual
moves the recorded TTFT by the fitted prefill and transfer cost of what changes, and leaves the
rest (queueing behind other prefills, HTTP and Python work) as recorded; on a shared host a whole run
shifts by up to ~25 % against another run of a near-identical configuration (the real "P cache on"
runs with and without bidirectional transfer, whose modelled costs differ by under 2 %, differed by
that much), which moves each arm's level but largely cancels in a difference taken within one run.
The levels are compared only when the four real runs' first requests (the same work in every arm)
agree within 15 %; otherwise the test ends skipped after the saving passed, as the what-if proof does.
"""

from __future__ import annotations

import json

import pytest

from kvtrace import semconv as sc
from kvtrace.analysis.whatif import arms
from kvtrace.bench.arms import arm_dir
from kvtrace.store import connect

from support.cli import run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

# a 12,000-token system prompt shared by two sessions, 4 turns of 200 user tokens and 100 output tokens
# (long enough that at TP 8 what reverse transfer saves stands well above the run-to-run noise)
SCENARIO = {
    "filetype": "kvtrace_scenario",
    "name": "long-context",
    "sessions": 2,
    "system_tokens": 12000,
    "turns": [{"label": "ask", "repeat": 4, "user_tokens": 200, "steps": [{"llm": {"output_tokens": 100}}]}],
}
SAVING_BOUND, TTFT_BOUND = 0.30, 0.35
# the first request (nothing cached, nothing to pull) is the same work in every arm: when the real runs'
# first TTFTs differ by more than this, the host moved them apart and their levels are not comparable
HOST_TOLERANCE = 0.15


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("arms-cf")
    scenario = root / "scenario.json"
    scenario.write_text(json.dumps(SCENARIO))
    traces = root / "runs"
    argv = ["bench", "--arms", "--input", str(scenario), "--presets", "qwen3-32b", "--sim-time-scale", "1"]
    done = run_cli(*argv, "--clients", "1", "--traces", str(traces), "--no-progress", timeout=800)
    assert done.returncode == 0, done.stderr[-3000:]
    return {(c, b): str(traces / "qwen3-32b" / arm_dir(c, b) / "r0") for c, b in arms.ARMS}


def _real(run: str) -> dict:
    """What the real run did: its P decisions and its mean TTFT at the proxy (model ms: time scale 1)."""
    con = connect(run)
    try:
        pulled, pulled_tokens, computed = con.execute(
            "SELECT count(*) FILTER (WHERE outcome = ?), "
            "coalesce(sum(pulled_tokens) FILTER (WHERE outcome = ?), 0), "
            "sum(prompt_tokens - local_hit_tokens - CASE WHEN outcome = ? THEN pulled_tokens ELSE 0 END) "
            "FROM kv_decisions WHERE engine_role = ? AND direction = ?",
            [sc.OUTCOME_PULLED] * 3 + [sc.ROLE_PREFILL, sc.DIRECTION_D2P],
        ).fetchone()
        [ttft] = con.execute("SELECT avg(ttft_ms) FROM requests WHERE ttft_ms IS NOT NULL").fetchone()
    finally:
        con.close()
    return {"pulled": pulled, "pulled_tokens": pulled_tokens, "computed_tokens": computed, "ttft_mean_ms": ttft}


def _first_ttft(run: str) -> float:
    con = connect(run)
    try:
        [ttft] = con.execute("SELECT ttft_ms FROM requests ORDER BY start_ns LIMIT 1").fetchone()
    finally:
        con.close()
    return round(ttft, 1)


def _counterfactual(run: str) -> arms.Arms:
    con = connect(run)
    try:
        return arms.counterfactual(con)
    finally:
        con.close()


@pytest.mark.parametrize("recorded", [(True, True), (False, True)], ids=["production", "published"])
def test_each_arm_makes_the_decisions_its_real_run_made(runs, recorded):
    cf = _counterfactual(runs[recorded])
    assert cf.recorded == recorded
    keys = ("pulled", "pulled_tokens", "computed_tokens")
    got = {(r["prefix_caching"], r["bidirectional"]): {k: r[k] for k in keys} for r in cf.rows}
    real = {arm: {k: v for k, v in _real(run).items() if k in keys} for arm, run in runs.items()}
    assert got == real
    assert [r["recorded"] for r in cf.rows] == [arm == recorded for arm in arms.ARMS]


def test_the_recorded_arm_is_the_recorded_ttft(runs):
    cf = _counterfactual(runs[(True, True)])
    assert cf.row(True, True)["ttft_mean_ms"] == pytest.approx(_real(runs[(True, True)])["ttft_mean_ms"], rel=1e-9)


def test_the_published_saving_and_every_arms_ttft_are_within_the_stated_bounds(runs):
    # recorded without reverse transfer, P cache off: its prefills span every size the other arms compute
    cf = _counterfactual(runs[(False, False)])
    real = {arm: _real(run)["ttft_mean_ms"] for arm, run in runs.items()}
    summary = cf.summary()["published_setup"]
    real_saving = real[(False, False)] - real[(False, True)]
    assert real_saving > 0
    assert summary["saved_ms"] == pytest.approx(real_saving, rel=SAVING_BOUND)
    levels = {arm: (round(cf.row(*arm)["ttft_mean_ms"], 1), round(real[arm], 1)) for arm in arms.ARMS}
    first = [_first_ttft(run) for run in runs.values()]
    spread = max(first) / min(first) - 1
    print(f"saving {summary['saved_ms']:.1f} vs {real_saving:.1f} ms; arms (cf, real) {levels}; first TTFT {first}")
    if spread > HOST_TOLERANCE:  # the real runs did not run on the same host conditions (module docstring)
        pytest.skip(f"saving checked; the real runs' first requests differ by {spread:.0%}: levels not comparable")
    for arm in arms.ARMS:
        assert cf.row(*arm)["ttft_mean_ms"] == pytest.approx(real[arm], rel=TTFT_BOUND), arm


def test_whatif_arms_json_and_the_report_state_the_same_numbers(runs, tmp_path):
    run = runs[(True, True)]
    done = run_cli("whatif", "--arms", "--format", "json", "--traces", run)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    cf = _counterfactual(run).to_dict()
    assert out["arms"] == cf["arms"] and out["summary"] == cf["summary"]
    assert out["recorded"] == {"prefix_caching": True, "bidirectional": True}
    assert set(out["summary"]["published_setup"]) == {
        "prefix_caching",
        "ttft_off_ms",
        "ttft_on_ms",
        "saved_ms",
        "gain",
        "kv_gib_s",
        "kv_peak_gib",
    }
    done = run_cli("report", "--traces", run, "--no-plots", "-o", str(tmp_path / "r.md"))
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "r.md").read_text()
    assert "## The four arms of this traffic" in text
    for line in _counterfactual(run).lines():
        assert line in text
