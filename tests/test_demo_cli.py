"""``kvtrace demo`` end to end: simulator + proxy + agent workload, twice; traces written; the
printed numbers are the views' numbers."""

from __future__ import annotations

import re

import pytest

from kvtrace import semconv as sc
from kvtrace.analysis import latency, reuse, sessions
from kvtrace.analysis.demo import SCENARIOS
from kvtrace.analysis.store import open_store
from kvtrace.analysis.text import ms, num, ratio
from kvtrace.cli import main

pytest.importorskip("aiohttp")
pytest.importorskip("openai")
pytestmark = pytest.mark.timeout(240)


def _cell(out: str, label: str) -> str:
    m = re.search(rf"^\| {re.escape(label)} +\| ([^|]+?) +\|", out, re.M)
    assert m, f"no row {label!r} in:\n{out}"
    return m.group(1)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    root = tmp_path_factory.mktemp("demo")
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["demo", "--traces", str(root), "--sessions", "1"])
    return rc, buf.getvalue(), root


def test_writes_both_runs(demo):
    rc, out, root = demo
    assert rc == 0, out
    for run in ("bidir", "baseline"):
        assert list((root / run).rglob("*.parquet")), run
    bidir, base = open_store(root / "bidir"), open_store(root / "baseline")
    expected = {f"demo-A0-{name}-0" for name in SCENARIOS}
    assert {r["session_id"] for r in sessions.breakdown(bidir).to_pylist()} == expected
    assert {r["session_id"] for r in sessions.breakdown(base).to_pylist()} == expected
    outcomes = {r["outcome"] for r in reuse.requests(bidir).to_pylist()}
    assert sc.OUTCOME_PULLED in outcomes and sc.OUTCOME_BELOW_THRESHOLD in outcomes
    assert sc.OUTCOME_PULLED not in {r["outcome"] for r in reuse.requests(base).to_pylist()}
    assert f"kvtrace dashboard --traces {root / 'bidir'} --compare {root / 'baseline'}" in out


def test_printed_numbers_match_the_views(demo):
    rc, out, root = demo
    bidir, base = open_store(root / "bidir"), open_store(root / "baseline")
    tot = sessions.totals(bidir)
    for label, col in (("input processing", "input_processing_ms"), ("generation", "generation_ms"),
                       ("tool waits", "tool_wait_ms"), ("app work", "app_work_ms"), ("wall time", "wall_ms")):
        assert _cell(out, label) == ms(tot[col]), label
    s = reuse.summary(bidir)
    assert _cell(out, "pulled tokens") == num(s["pulled_tokens"])
    assert _cell(out, "P reuse decisions (d2p)") == num(s["decisions"])
    rows = latency.compare_runs(base, bidir)
    printed = re.findall(r"^\| (\d+) +\| ([^|]+?) +\| ([^|]+?) +\| ([^|]+?) +\|", out.split("TTFT and turn")[1], re.M)
    assert [(int(t), b, c, r) for t, b, c, r in printed] == [
        (row["turn"], ms(row["ttft_p50_ms_baseline"]), ms(row["ttft_p50_ms_candidate"]), ratio(row["ttft_p50_ms_ratio"]))
        for row in rows
    ]


def test_bad_arguments(tmp_path, capsys):
    assert main(["demo", "--traces", str(tmp_path), "--sessions", "0"]) == 2
    assert "--sessions" in capsys.readouterr().err
    (tmp_path / "bidir").mkdir()
    (tmp_path / "bidir" / "notes.txt").write_text("mine")
    assert main(["demo", "--traces", str(tmp_path)]) == 2
    assert "other than Parquet" in capsys.readouterr().err
    assert (tmp_path / "bidir" / "notes.txt").exists()
