"""``kvtrace bench --arms`` on the virtual clock (its default): the four arms' clusters, the proxy
and the client in one process on the virtual-time loop; the same seed prints the same tables, byte
for byte, and the arms make the decisions their configuration allows."""

from __future__ import annotations

import json

import pytest

from kvtrace import semconv as sc
from kvtrace.analysis import arms_table as arms
from kvtrace.bench.arms import arm_dir
from kvtrace.cli import main
from kvtrace.store import connect

from support.cli import run_cli

pytest.importorskip("aiohttp")

SCENARIO = {
    "filetype": "kvtrace_scenario",
    "name": "tiny",
    "sessions": 2,
    "system_tokens": 200,
    "turns": [{"label": "ask", "repeat": 3, "user_tokens": 40, "steps": [{"llm": {"output_tokens": 120}}]}],
}


def _arms(root, name: str):
    scenario = root / "tiny.json"
    scenario.write_text(json.dumps(SCENARIO))
    traces = root / name
    done = run_cli(
        "bench", "--arms", "--input", str(scenario), "--presets", "qwen3-32b", "--clients", "2",
        "--seed", "3", "--traces", str(traces), "--no-progress",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return traces, done.stdout


@pytest.fixture(scope="module")
def twice(tmp_path_factory):
    root = tmp_path_factory.mktemp("varms")
    return _arms(root, "a"), _arms(root, "b")


def test_one_seed_prints_the_same_tables_byte_for_byte(twice):
    (a, first), (b, second) = twice
    first, second = first.replace(str(a), "DIR"), second.replace(str(b), "DIR")  # the tables name their runs
    assert "### qwen3-32b (simulated time; time scale 1;" in first
    assert first == second
    assert "wall clock:" not in first and "ran late" not in first  # nothing is late on the virtual clock


def test_virtual_arms_make_the_decisions_their_configuration_allows(twice):
    (traces, _), _ = twice
    for cache, bidir in arms.ARMS:
        con = connect(str(traces / "qwen3-32b" / arm_dir(cache, bidir) / "r0"))
        rows = con.execute(
            "SELECT turn, outcome, pulled_tokens FROM kv_decisions WHERE engine_role = ? AND direction = ? "
            "ORDER BY session_id, turn",
            [sc.ROLE_PREFILL, sc.DIRECTION_D2P],
        ).fetchall()
        assert [t for t, *_ in rows] == [0, 1, 2] * 2
        later = {o for t, o, _ in rows if t >= 1}
        assert later == ({sc.OUTCOME_PULLED} if bidir else later - {sc.OUTCOME_PULLED}), rows
        assert bidir or all(not p for *_, p in rows)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--arms", "--clock", "virtual", "--sim-time-scale", "5", "--traces", "{d}"], "goes with --clock wall"),
        (["--clock", "virtual", "--url", "http://127.0.0.1:9"], "--clock goes only with --arms"),
    ],
)
def test_clock_errors_are_one_line(tmp_path, capsys, argv, message):
    argv = [a.replace("{d}", str(tmp_path / "runs")) for a in argv]
    assert main(["bench", "--scenario", "coding-agent", "--no-progress", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kvtrace bench: error: ") and message in err, err
