"""What the report says its times are, from the clocks the simulated workers ran on
(``kvtrace.sim.clock``); the runs themselves: test_report_per_instance.py (a virtual arm, a served one)."""

from __future__ import annotations

import pytest

from kvtrace import semconv as sc
from kvtrace.analysis import sessions
from kvtrace.analysis.report import document


@pytest.mark.parametrize(
    ("clocks", "note"),
    [
        ([], document.TIME_NOTE),  # real engines, or spans from before the clock was named
        ([sc.CLOCK_WALL], document.TIME_NOTE),
        ([sc.CLOCK_VIRTUAL], document.VIRTUAL_TIME_NOTE),
        ([sc.CLOCK_VIRTUAL, sc.CLOCK_WALL], document.MIXED_TIME_NOTE),
    ],
)
def test_the_note_follows_the_clocks(clocks, note):
    assert document.time_note(clocks) == note


class _NoQuery:
    def __getattr__(self, name):
        raise AssertionError(f"a store without simulated spans was read ({name})")


def test_a_store_without_the_simulator_is_not_read_for_its_clock():
    assert sessions.clocks(_NoQuery(), (sc.SUBSTRATE_VLLM,)) == []
    assert sessions.clocks(_NoQuery(), ()) == []


def test_a_virtual_run_reads_as_virtual_on_duckdb_and_on_clickhouse(tmp_path):
    pytest.importorskip("aiohttp")
    pytest.importorskip("openai")
    pytest.importorskip("chdb")
    from kvtrace.bench import inproc
    from kvtrace.sim import virtual
    from kvtrace.store import connect

    from support import clickhouse_check

    run_dir = str(tmp_path / "v")
    cfg = dict(scenario="short-followups", sessions=2, seed=1, nonce="clock")
    virtual.run(inproc.run_arm(run_dir, "qwen3-32b", True, True, "efa-3200", cfg, "A", 450.0), seed=1)
    assert sessions.clocks(connect(run_dir), (sc.SUBSTRATE_SIM,)) == [sc.CLOCK_VIRTUAL]
    assert sessions.clocks(clickhouse_check.load_dir(run_dir), (sc.SUBSTRATE_SIM,)) == [sc.CLOCK_VIRTUAL]
