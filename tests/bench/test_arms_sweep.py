"""``kvtrace bench --arms --sweep prefix=...``: one four-arm run per first-turn prefix length, in
``DIR/prefix-N``, and one table per preset with mean TTFT, P's prefill and the d2p transfer per
arm, and the gains per point."""

from __future__ import annotations

import json
import os

import pytest

from kvtrace import semconv as sc
from kvtrace.analysis import arms_table as arms
from kvtrace.analysis import compare
from kvtrace.bench.arms import arm_dir
from kvtrace.store import connect

from support.cli import run_cli

# 2 conversations x 2 requests (4 messages), 200-token answers (> kv_recompute_threshold 64), no common prefix
GEN = {
    "filetype": "generate_conversations",
    "num_conversations": 2,
    "text_files": ["absent.txt"],
    "prompt_input": {
        "num_turns": {"distribution": "constant", "value": 4},
        "prefix_num_tokens": {"distribution": "constant", "value": 50},
        "num_tokens": {"distribution": "constant", "value": 40},
    },
    "prompt_output": {"num_tokens": {"distribution": "constant", "value": 200}},
}
POINTS = (100, 300)


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    conf = root / "gen.json"
    conf.write_text(json.dumps(GEN))
    traces = root / "runs"
    argv = ["bench", "--arms", "--input", str(conf), "--sweep", "prefix=100,300", "--presets", "qwen3-32b"]
    argv += ["--sim-time-scale", "50", "--clients", "2", "--traces", str(traces), "--no-progress"]
    done = run_cli(*argv, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return traces, done.stdout


def test_each_point_runs_the_four_arms_with_its_prefix(swept):
    traces, _ = swept
    assert sorted(os.listdir(traces)) == ["prefix-100", "prefix-300"]
    first_turn = {}
    for prefix in POINTS:
        for cache, bidir in arms.ARMS:
            run = traces / f"prefix-{prefix}" / "qwen3-32b" / arm_dir(cache, bidir) / "r0"
            rows = (
                connect(str(run))
                .execute(
                    "SELECT turn, prompt_tokens FROM kv_decisions WHERE engine_role = ? AND direction = ? "
                    "ORDER BY session_id, turn",
                    [sc.ROLE_PREFILL, sc.DIRECTION_D2P],
                )
                .fetchall()
            )
            assert [t for t, _ in rows] == [0, 1, 0, 1]
            first_turn.setdefault(prefix, set()).update(n for t, n in rows if t == 0)
    # the prefix is what differs between the points: 200 more tokens in every first turn
    (a,), (b,) = first_turn[100], first_turn[300]
    assert b - a == 200


def test_the_sweep_table_has_a_row_per_point_and_the_gains_of_compare(swept):
    traces, out = swept
    lines = [line for line in out.splitlines() if line.startswith("| ")]
    cols = [c.strip() for c in lines[0].strip("|").split("|")]
    assert cols[0] == "prefix" and cols[-3:] == [
        "published gain (P cache off)",
        "published gain, turns >= 1",
        "incremental gain (P cache on)",
    ]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[1:]]
    assert [r[0] for r in rows] == ["100", "300"]
    points = arms.sweep_from_directory(traces)
    assert [p.prefix for p in points] == list(POINTS)
    for row, point in zip(rows, points, strict=True):
        (t,) = point.tables
        means = [arms._mean(t.arms[k], "ttft_ms", compare.ALL) for k in arms.ARMS]
        assert row[1:5] == [f"{m:,.0f}" for m in means]
        assert row[5] == " / ".join(f"{t.arms[k].prefill_ms:,.0f}" for k in arms.ARMS)
        assert t.arms[(False, False)].d2p_ms is None  # bidirectional off: nothing pulled from D
        assert row[6] == f"{t.arms[(False, True)].d2p_ms:,.0f} / {t.arms[(True, True)].d2p_ms:,.0f}"
        r = compare.row(t.published, "ttft_ms", compare.ALL)
        assert row[7].startswith(f"x{1 / r['ratio']:.2f} [{1 / r['ci_high']:.2f}-{1 / r['ci_low']:.2f}]")
    with pytest.raises(ValueError, match="holds a sweep"):
        arms.from_directory(traces)  # the four-arm reader refuses to pool the points as repeats


def test_the_report_of_a_sweep_directory_is_the_sweep_table(swept, tmp_path):
    traces, out = swept
    done = run_cli("report", "--traces", str(traces), "-o", str(tmp_path / "r.md"))
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "r.md").read_text()
    assert text.startswith("# kvtrace report: the four arms per prefix length\n")
    table = lambda s: [line for line in s.splitlines() if line.startswith(("|", "###"))]  # noqa: E731
    assert table(text) == table(out) and len(table(text)) == 5  # heading, columns, rule, two points
