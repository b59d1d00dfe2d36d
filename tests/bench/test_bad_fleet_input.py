"""Bad input to a fleet run ends in one clear line, never a hang: a routing policy that does not
exist (``kvtrace bench --arms --routing``, ``kvtrace proxy --routing``), and a Mooncake trace whose
rows are out of timestamp order with a month-long gap (replayed in timestamp order, the gap costing
no time on the virtual clock).  The impossible topologies are in ``test_arms.py``."""

from __future__ import annotations

import json
import time

import pytest

from kvtrace import semconv as sc
from kvtrace.bench.fleet import Fleet
from kvtrace.cli import main
from kvtrace.sim import virtual

pytest.importorskip("aiohttp")
pytest.importorskip("openai")


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "--arms", "--scenario", "coding-agent", "--routing", "nearest"],
        ["proxy", "--prefiller-ports", "8100", "8101", "--decoder-ports", "8200", "--routing", "nearest"],
    ],
    ids=["bench", "proxy"],
)
def test_an_unknown_policy_is_refused_before_anything_starts(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"kvtrace {argv[0]}: error: argument --routing: invalid choice: 'nearest' (choose from")
    assert all(p in last for p in sc.ROUTING_POLICIES)


def test_an_unsorted_trace_with_a_month_long_gap_replays_in_order_without_waiting(tmp_path):
    from kvtrace.bench import inproc

    month_ms = 30 * 24 * 3600 * 1000
    rows = [  # file order is not time order; line 1 extends line 2's prompt a month later: its next turn
        (month_ms + 5000, 1100, 8, [1, 2, 3]),
        (0, 1100, 8, [1, 2, 9]),
        (1000, 600, 8, [4, 5]),
    ]
    path = tmp_path / "t.jsonl"
    path.write_text(
        "".join(
            json.dumps(dict(zip(("timestamp", "input_length", "output_length", "hash_ids"), r, strict=True))) + "\n"
            for r in rows
        )
    )
    cfg = dict(input=str(path), nonce="g")
    t0 = time.monotonic()
    result = virtual.run(
        inproc.run_arm(str(tmp_path / "run"), "qwen3-32b", True, True, "efa-3200", cfg, "A", 450.0, None, Fleet(2, 2))
    )
    assert time.monotonic() - t0 < 60  # a month of trace, on the virtual clock
    assert [r.error for r in result.requests] == [None] * 3
    starts = sorted((r.start_s, r.session.split("-", 2)[-1], r.call) for r in result.requests)
    # in time order: line 2 (session 0), line 3 (session 1), then line 1, session 0's next turn, a month on
    assert [(s, c) for _, s, c in starts] == [("mc0-l2", 0), ("mc1-l3", 0), ("mc0-l2", 1)]
    assert starts[-1][0] >= month_ms / 1000


def test_a_trace_that_would_keep_a_wall_clock_arm_waiting_for_days_is_refused(tmp_path, capsys):
    path = tmp_path / "gap.jsonl"
    rows = [(0, 600, 8, [1, 2]), (30 * 24 * 3600 * 1000, 1100, 8, [1, 2, 3])]  # a month apart
    keys = ("timestamp", "input_length", "output_length", "hash_ids")
    path.write_text("".join(json.dumps(dict(zip(keys, r, strict=True))) + "\n" for r in rows))
    argv = ["bench", "--arms", "--input", str(path), "--clock", "wall", "--presets", "qwen3-32b"]
    assert main([*argv, "--traces", str(tmp_path / "runs"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "kvtrace bench: error: the trace spans 2,592,000 s of model time, 144.0 h of wall time per arm at time "
        "scale 5: use --clock virtual (no wall time spent waiting)\n"
    )


@pytest.mark.parametrize("clock", ["virtual", "wall"])
def test_a_bad_trace_file_leaves_no_directory_behind_so_the_fixed_rerun_starts(tmp_path, capsys, clock):
    """The file is read before the first arm's directory is made: a directory left behind would make
    the rerun with the file fixed fail as "not empty"."""
    path = tmp_path / "short.jsonl"
    path.write_text('{"timestamp": 5, "input_length": 10}\n')
    runs = tmp_path / "runs"
    argv = ["bench", "--arms", "--input", str(path), "--clock", clock, "--presets", "qwen3-32b", "--no-progress"]
    assert main([*argv, "--traces", str(runs)]) == 2
    assert capsys.readouterr().err == (
        "kvtrace bench: error: short.jsonl: line 1: expected an object with timestamp, input_length, "
        "output_length, hash_ids (missing output_length, hash_ids)\n"
    )
    assert not runs.exists() or not any(runs.iterdir())
