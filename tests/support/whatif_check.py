"""``kvtrace whatif``'s recorded row against the recorded outcomes of a trace directory.

For the vLLM end-to-end test (``tests/vllm/test_end_to_end.py``), after its traces are flushed::

    from support.whatif_check import check_recorded_row   # tests/ is on sys.path under pytest
    row = check_recorded_row(traces_dir)           # the directory kvtrace traced the run into

It runs the real command (``kvtrace whatif --traces DIR --format json``) in-process and asserts
that the row flagged ``recorded`` reproduces, exactly, what the traces recorded: d2p decisions by
outcome, pulled and recomputed tokens (``kv_decisions``), GiB·s held on D (``kv_retention``, model
seconds) and mean TTFT (``requests``, model ms).  That holds only if vLLM's rules, applied by the
replay to each decision's recorded inputs, give back each recorded outcome.  Returns the row.
``tests/analysis/whatif/test_replay.py`` and ``tests/analysis/whatif/test_replay_predicts_simulator.py``
call it on synthetic and simulator traces.
"""

from __future__ import annotations

import json
import math

from kvtrace import semconv as sc

OUTCOMES = ("pulled", "expired", "below_threshold", "no_remote", "local_hit", "failed")


def recorded_outcomes(traces_dir) -> dict:
    """What the traces say happened, straight from the store's views (model time)."""
    from kvtrace.analysis.common import rows
    from kvtrace.store import connect

    con = connect(traces_dir)
    mix = {
        r["outcome"]: r
        for r in rows(
            con,
            "SELECT outcome, count(*) AS n, sum(pulled_tokens) AS pulled, "
            "sum(recomputed_tokens) AS recomputed FROM kv_decisions "
            f"WHERE direction = '{sc.DIRECTION_D2P}' GROUP BY outcome",
        )
    }
    scale = rows(con, "SELECT max(time_scale) AS s FROM turn_gaps")[0]["s"] or 1.0
    held = rows(con, "SELECT sum(byte_seconds) AS bs FROM kv_retention")[0]["bs"] or 0.0
    ttft = rows(con, "SELECT avg(ttft_ms) AS t FROM requests WHERE ttft_ms IS NOT NULL")[0]["t"]
    return {
        "decisions": sum(r["n"] for r in mix.values()),
        **{o: mix[o]["n"] if o in mix else 0 for o in OUTCOMES},
        "pulled_tokens": sum(int(r["pulled"] or 0) for r in mix.values()),
        "recomputed_tokens": sum(int(r["recomputed"] or 0) for r in mix.values()),
        "gib_s_held": held * scale / 2**30,
        "ttft_mean_ms": None if ttft is None else ttft * scale,
    }


def check_recorded_row(traces_dir) -> dict:
    """Run ``kvtrace whatif --format json`` on ``traces_dir`` and assert its recorded row equals
    the recorded outcomes; returns the row."""
    import contextlib
    import io

    from kvtrace.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["whatif", "--traces", str(traces_dir), "--format", "json"])
    assert code == 0, err.getvalue()
    assert "Recommendation:" in err.getvalue()
    rows = json.loads(out.getvalue())
    [row] = [r for r in rows if r["recorded"]]
    want = recorded_outcomes(traces_dir)
    for key, value in want.items():
        if isinstance(value, float):
            assert math.isclose(row[key], value, rel_tol=1e-9, abs_tol=1e-9), (key, row[key], value)
        else:
            assert row[key] == value, (key, row[key], value)
    return row
