"""The what-if replay as plain data for the dashboard's "What-if" page and ``kvtrace report``.

:func:`advice` runs the replay (:mod:`.replay`) and returns rows, the recommendation and the
calibration as dicts and lists (cacheable, picklable); :func:`gaps` lists the recorded turn gaps
(the ``turn_gaps`` view) with the dashboard's filters; :func:`pareto` marks the settings no other
setting beats on both memory held and TTFT; :func:`report_section` is the report's Markdown.
"""

from __future__ import annotations

import pyarrow as pa

from kvtrace.analysis.common import filtered
from kvtrace.analysis.filters import SESSION_ROW_SCOPE, Filters
from kvtrace.analysis.whatif.replay import (
    COLUMNS,
    DEFAULT_THRESHOLDS,
    DEFAULT_TTLS,
    WhatIfError,
    recommend,
    recommendation_lines,
    run,
)

GAPS_SQL = """
SELECT session_id, turn, COALESCE(scenario, agent_name, '(no agent span)') AS scenario, agent_name, engine_id,
       gap_s, held_s, ttl_s, offer_ttl_s, tokens, bytes, offered, offer_reason, outcome, retention_outcome
FROM (SELECT * FROM turn_gaps WHERE gap_s IS NOT NULL) {where}
ORDER BY start_ns LIMIT $limit
"""


def advice(
    con,
    ttls=DEFAULT_TTLS,
    thresholds=DEFAULT_THRESHOLDS,
    offer_margin_s: float | None = None,
    budget_gib: float | None = None,
) -> dict:
    """Replay the whole store on the grid: ``rows`` (the :data:`~.replay.COLUMNS` plus
    ``failures``, requests predicted to fail), ``recommendation`` (see :func:`~.replay.recommend`),
    ``lines`` (its printed form), the recorded setting and D's KV pool sizes.  ``error``: why there
    is nothing to replay (then the rest is empty)."""
    try:
        rec, results = run(con, ttls, thresholds, offer_margin_s)
    except WhatIfError as exc:
        return {"error": str(exc), "rows": [], "recommendation": None, "lines": []}
    rc = recommend(rec, results, budget_gib)
    rows = [{**r.row, "failures": r.failures, "offer_margin_s": r.offer_margin_s} for r in results]
    return {
        "error": None,
        "rows": rows,
        "lines": recommendation_lines(rec, rc),
        "recommendation": {k: rc[k] for k in ("ttl_s", "threshold", "metric", "why_ttl", "why_threshold")},
        "recorded": {
            "ttl_s": rec.ttl_s,
            "ttls": rec.ttls,
            "threshold": rec.threshold,
            "offer_margin_s": rec.offer_margin_s,
            "offer_margin_known": rec.offer_margin_known,
            "time_scale": rec.time_scale,
        },
        "pool_bytes": dict(rec.pool_bytes),
        "break_even_tokens": rec.calibration.break_even_tokens,
    }


def gaps(con, filters: Filters | None = None, limit: int = 200_000) -> pa.Table:
    """Recorded gaps between a turn's decode end on D and the session's next d2p decision (model
    s), with what D held, the TTL in force and the outcome."""
    return filtered(con, GAPS_SQL, filters, SESSION_ROW_SCOPE, limit=limit)


def pareto(rows: list[dict], x: str = "gib_s_held", y: str = "ttft_mean_ms") -> list[dict]:
    """``rows`` with ``pareto`` True where no other row is at least as good on both ``x`` and ``y``
    and better on one (rows without ``y`` are never on the front)."""
    out = []
    for r in rows:
        front = r[y] is not None and not any(
            o[y] is not None and o[x] <= r[x] and o[y] <= r[y] and (o[x] < r[x] or o[y] < r[y]) for o in rows
        )
        out.append({**r, "pareto": front})
    return out


def report_section(con) -> str:
    """``kvtrace report``'s what-if section: the recommendation, and the rows of the recommended
    threshold (every TTL) plus the recorded setting."""
    from kvtrace.analysis.report.text import md_table

    a = advice(con)
    head = (
        "## What-if: retention TTL and recompute threshold\n\nThe recorded d2p decisions replayed with vLLM's "
        "rules under other `decoder_kv_blocks_ttl` / `kv_recompute_threshold` settings (`kvtrace whatif`; "
        "model seconds).\n\n"
    )
    if a["error"]:
        return head + f"Nothing to replay: {a['error']}."
    th = a["recommendation"]["threshold"]
    rows = [r for r in a["rows"] if r["threshold"] == th or r["recorded"]]
    cols = [c for c in COLUMNS if c not in ("decisions", "failed")]
    body = [[cell(c, r[c]) for c in cols] for r in rows]
    return head + "\n".join(a["lines"]) + "\n\n" + md_table(cols, body)


def arms_section(con) -> str:
    """``kvtrace report``'s four arms of the recorded traffic (:mod:`.arms`): what reverse transfer
    saved on this deployment, what it would show in the published setup, and the KV it held."""
    from kvtrace.analysis.calibrate import CalibrationError
    from kvtrace.analysis.report.text import md_table
    from kvtrace.analysis.whatif import arms

    head = (
        "## The four arms of this traffic\n\nThe recorded P requests decided again with P's prefix cache off / "
        "on and bidirectional transfer off / on (`kvtrace whatif --arms`); TTFT = recorded - P's recorded "
        "prefill and transfer + the arm's, priced by this run's calibration (model ms).\n\n"
    )
    try:
        result = arms.counterfactual(con)
    except (CalibrationError, arms.ArmsError) as exc:
        return head + f"Not available: {exc}."
    body = [[cell(c, r[c]) for c in arms.COLUMNS] for r in result.rows]
    return head + "\n".join(result.lines()) + "\n\n" + md_table(list(arms.COLUMNS), body)


def cell(key: str, value) -> str:
    """One value of a what-if row for a text table."""
    if value is None and key == "ttl_s":  # the recorded setting of Ds that ran different TTLs
        return "each D's own"
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else ""
    if isinstance(value, str):  # an arm's label (kvtrace's own text)
        return value
    if key in ("peak_gib_held", "kv_peak_gib"):
        return f"{value:,.3f}"
    if key == "ttl_s":
        return f"{value:g}"
    if isinstance(value, float):
        return f"{value:,.2f}" if key in ("gib_s_held", "kv_gib_s") else f"{value:,.1f}"
    return f"{value:,}"
