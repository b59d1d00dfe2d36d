"""``kvtrace bench --arms``: the published configuration (P prefix cache off) beside a production
one (on), each with bidirectional transfer off and on, on simulated 1P+1D clusters; ``kvtrace
report`` on the same directory prints the same table."""

from __future__ import annotations

import json
import os
import re

import pytest

from kvtrace import semconv as sc
from kvtrace.analysis import arms_table as arms
from kvtrace.analysis import compare
from kvtrace.bench.arms import arm_dir
from kvtrace.cli import main
from kvtrace.store import connect

from support.cli import run_cli

# 2 sessions x 3 turns; each answer (120 tokens) is more than kv_recompute_threshold (64), so with
# P's prefix cache on there is still something worth pulling: D's answer and the new user message
SCENARIO = {
    "filetype": "kvtrace_scenario",
    "name": "tiny",
    "sessions": 2,
    "system_tokens": 200,
    "turns": [{"label": "ask", "repeat": 3, "user_tokens": 40, "steps": [{"llm": {"output_tokens": 120}}]}],
}
ARM_LABELS = [arms.arm_label(c, b) for c, b in arms.ARMS]


@pytest.fixture(scope="module")
def armed(tmp_path_factory):
    root = tmp_path_factory.mktemp("arms")
    scenario = root / "tiny.json"
    scenario.write_text(json.dumps(SCENARIO))
    traces = root / "runs"
    done = run_cli(
        "bench",
        "--arms",
        "--input",
        str(scenario),
        "--presets",
        "qwen3-32b",
        "--sim-time-scale",
        "50",
        "--clients",
        "2",
        "--traces",
        str(traces),
        "--json",
        str(root / "arms.json"),
        "--no-progress",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return traces, done.stdout, json.loads((root / "arms.json").read_text())


def _decisions(run: str) -> list[tuple]:
    con = connect(run)
    return con.execute(
        "SELECT turn, outcome, local_hit_tokens, pulled_tokens FROM kv_decisions WHERE engine_role = ? "
        "AND direction = ? ORDER BY session_id, turn",
        [sc.ROLE_PREFILL, sc.DIRECTION_D2P],
    ).fetchall()


def test_four_arms_make_the_decisions_their_configuration_allows(armed):
    traces, _, result = armed
    runs = {f"qwen3-32b/{arm_dir(c, b)}/r0" for c, b in arms.ARMS}
    assert set(result["runs"]) == runs
    for cache, bidir in arms.ARMS:
        run = traces / "qwen3-32b" / arm_dir(cache, bidir) / "r0"
        rows = _decisions(str(run))
        assert [t for t, *_ in rows] == [0, 1, 2] * 2  # every call of both sessions decided on P
        later = [r for r in rows if r[0] >= 1]
        outcomes = {o for _, o, _, _ in later}
        if bidir:
            assert outcomes == {sc.OUTCOME_PULLED}, rows
            assert all(p >= 64 for *_, p in later)
        else:
            assert sc.OUTCOME_PULLED not in {o for _, o, _, _ in rows} and all(not p for *_, p in rows), rows
        if cache:  # P keeps turn t-1's prompt: at least the system prompt and first user message hit
            assert all(h >= 240 - 16 for _, _, h, _ in later), rows
        else:
            assert all(not h for _, _, h, _ in rows), rows
        ident = arms.identify(connect(str(run)))
        assert ident == {"preset": "qwen3-32b", "prefix_caching": cache, "bidirectional": bidir, "time_scale": 50.0}


def test_the_table_per_preset_and_report_prints_the_same(armed):
    traces, out, result = armed
    table = out.split("\n\n", 1)[1]
    # --clock wall (--sim-time-scale given) ends with how late the event loops ran; kvtrace report has no such line
    table, late = table.rstrip("\n").rsplit("\n", 1)
    assert re.fullmatch(
        r"wall clock: this machine's event loops ran late by p50 [\d.]+ ms, p99 [\d.]+ ms, max [\d.]+ ms "
        r"\(\d+ wake-ups of the bench's loop\); every simulated time above includes lateness of this order "
        r"\(--clock virtual has none\)",
        late,
    ), late
    summary = result["wall_lateness"]
    assert summary["samples"] > 0 and 0 <= summary["p50_ms"] <= summary["p99_ms"] <= summary["max_ms"]
    table += "\n"
    head = re.search(r"^### qwen3-32b \(simulated time; time scale 50; 1 run per arm; .*\)$", table, re.M)
    assert head, table
    lines = [line for line in table.splitlines() if line.startswith("| ")]
    cols = [c.strip() for c in lines[0].strip("|").split("|")]
    assert cols == ["metric", *ARM_LABELS, "published gain (P cache off)", "incremental gain (P cache on)"]
    names = [line.strip("|").split("|")[0].strip() for line in lines[1:]]
    assert names == [
        "TTFT turn 0 (ms)",
        "TTFT turn 1 (ms)",
        "TTFT turn 2 (ms)",
        "TTFT turns >= 1 (ms)",
        "TTFT all turns (ms)",
        "task latency turns >= 1 (ms)",
        "task latency all turns (ms)",
        "D KV held (GiB·s)",
        "D KV peak (GiB)",
    ]
    gain = re.compile(r"^x\d+\.\d\d \[\d+\.\d\d-\d+\.\d\d\] (faster|slower|within noise)$")
    for line in lines[1:8]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert all(re.fullmatch(r"[\d,]+\.\d", c) for c in cells[1:5]), line
        assert gain.match(cells[5]) and gain.match(cells[6]), line
    # the gains are compare's ratios inverted, A = bidirectional off, per P cache setting
    found = arms.tables(arms.from_directory(traces))
    (t,) = found
    for rows_, column in ((t.published, 5), (t.incremental, 6)):
        r = compare.row(rows_, "ttft_ms", compare.LATER)
        cell = [c.strip() for c in lines[4].strip("|").split("|")][column]
        assert cell.startswith(f"x{1 / r['ratio']:.2f} [{1 / r['ci_high']:.2f}-{1 / r['ci_low']:.2f}]")
    held = [float(c) for c in lines[8].strip("|").split("|")[1:5]]
    assert held[1] > 0 and held[3] > 0  # bidirectional on: D keeps each answer for the next turn
    report = run_cli("report", "--traces", str(traces))
    assert report.returncode == 0, report.stderr
    assert report.stdout.rstrip("\n") == "# kvtrace report: published vs production configuration\n\n" + table.rstrip(
        "\n"
    )


def test_tables_invert_compare_and_name_a_missing_arm():
    def arm(cache, bidir, ttft):
        return arms.Arm(
            f"d/{arm_dir(cache, bidir)}/r0",
            "p",
            cache,
            bidir,
            1.0,
            [("ttft_ms", t, 0, v) for t in (0, 1) for v in ttft],
        )

    found = [
        arm(False, False, [100, 110]),
        arm(False, True, [50, 55]),
        arm(True, False, [40, 44]),
        arm(True, True, [40, 44]),
    ]
    (t,) = arms.tables(found)
    assert compare.row(t.published, "ttft_ms", 1)["ratio"] == pytest.approx(0.5)
    cols, body = arms.table_rows(t)
    assert body[1][:5] == ["TTFT turn 1 (ms)", "105.0", "52.5", "42.0", "42.0"]
    assert body[1][5].startswith("x2.00 [") and body[1][6].startswith("x1.00 [")
    with pytest.raises(ValueError, match=r"^p: no run of P cache on, bidir on$"):
        arms.tables(found[:3])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--arms", "--url", "http://127.0.0.1:9", "--traces", "{d}"], "no --url or --ab-url"),
        (["--arms"], "--arms needs --traces DIR"),
        (
            ["--arms", "--presets", "no-such-model", "--traces", "{d}"],
            "unknown preset 'no-such-model'; choose from qwen3-32b",
        ),
        (
            ["--presets", "glm5-fp8", "--url", "http://127.0.0.1:9"],
            "--presets goes only with --arms",
        ),
        (
            ["--prefillers", "2", "--routing", "kv-aware", "--url", "http://127.0.0.1:9"],
            "--prefillers, --routing go only with --arms",
        ),
        (["--arms", "--prefillers", "0", "--traces", "{d}"], "impossible topology 0P1D: a fleet needs at least one"),
        (
            ["--arms", "--clients", "99999", "--traces", "{d}"],
            "99999 clients are more than 1P1D can hold: the proxy queues at most 5120 requests per role",
        ),
        ([], "--url is required (or --arms)"),
    ],
)
def test_arms_errors_are_one_line(tmp_path, capsys, argv, message):
    argv = [a.replace("{d}", str(tmp_path / "runs")) for a in argv]
    assert main(["bench", "--scenario", "coding-agent", "--no-progress", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kvtrace bench: error: ") and message in err, err
    assert not (tmp_path / "runs").exists() or not os.listdir(tmp_path / "runs")


def test_arms_need_a_directory_of_their_own(tmp_path, capsys):
    (tmp_path / "old.txt").write_text("x")
    assert main(["bench", "--arms", "--scenario", "coding-agent", "--traces", str(tmp_path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err == f"kvtrace bench: error: {tmp_path} is not empty: the arms' runs need a directory of their own\n"
