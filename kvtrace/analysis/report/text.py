"""Plain-text / Markdown tables of the analysis results, shared by ``kvtrace demo`` (console)
and ``kvtrace report`` (Markdown and HTML).

Each ``*_rows`` function returns (columns, rows of display strings) straight from the query
functions, so what is printed is exactly what the views hold (ms rounded to 0.1).  The cell
formats and :func:`md_table` live in :mod:`kvtrace.analysis.report.cells`; they are importable
from here too.
"""

from __future__ import annotations

import textwrap

from kvtrace import semconv as sc
from kvtrace.analysis import compare, latency, retention, reuse, sessions
from kvtrace.analysis.common import rows as query_rows
from kvtrace.analysis.filters import Filters
from kvtrace.analysis.palette import PART_LABELS as PART_NAMES
from kvtrace.analysis.report.cells import MD_ESCAPED as MD_ESCAPED
from kvtrace.analysis.report.cells import MD_SPECIAL as MD_SPECIAL
from kvtrace.analysis.report.cells import gib, ms, num, ratio
from kvtrace.analysis.report.cells import md_escape as md_escape
from kvtrace.analysis.report.cells import md_table as md_table
from kvtrace.analysis.report.cells import md_unescape as md_unescape
from kvtrace.store.sql import literal
from kvtrace.store.units import GIB
from kvtrace.store.views.breakdown import PART_COLUMNS

WIDTH = 120  # console output (kvtrace demo) fits this many columns


def wrap(paragraph: str, width: int = WIDTH) -> str:
    """A paragraph of console prose wrapped at ``width`` (paths and commands are never split)."""
    return textwrap.fill(paragraph, width, break_long_words=False, break_on_hyphens=False)


def breakdown_totals_rows(con, filters: Filters | None = None) -> tuple[list[str], list[list[str]]]:
    tot = sessions.totals(con, filters)
    wall = tot["wall_ms"] or 0
    rows = [[name, ms(tot[col]), f"{tot[col] / wall:.1%}" if wall else "–"] for col, name in PART_NAMES.items()]
    rows.append(["wall time", ms(wall), "100.0%" if wall else "–"])
    return ["part", "wall ms (all sessions)", "share"], rows


def unplaced_warning(con, directory: str, filters: Filters | None = None) -> str:
    """A Markdown warning (ending in a blank line) when sessions hold agent-side spans the breakdown
    could not place, else ``""``."""
    tot = sessions.totals(con, filters)
    if not tot["flagged_sessions"]:
        return ""
    return (
        f"> **Warning:** {tot['flagged_sessions']:,} session(s) hold {tot['unplaced_spans']:,} agent-side span(s) "
        "the breakdown could not place (a convention's attribute with a value kvtrace does not map); their time "
        f"counts as unattributed. `kvtrace doctor --traces {directory}` lists them.\n\n"
    )


def breakdown_rows(con, filters: Filters | None = None, limit: int = 20) -> tuple[list[str], list[list[str]]]:
    """The longest sessions and their parts, in wall ms."""
    cols = ["session", "turns", "wall ms", "input", "generation", "tool waits", "app work", "user pauses"]
    rows = [
        [r["session_id"], num(r["turns"]), ms(r["wall_ms"]), *(ms(r[c]) for c in PART_COLUMNS)]
        for r in sessions.breakdown(con, filters, limit=limit).to_pylist()
    ]
    return cols, rows


def reuse_rows(con, filters: Filters | None = None) -> tuple[list[str], list[list[str]]]:
    s = reuse.summary(con, filters)
    rate = "–" if s["pull_rate"] is None else f"{s['pull_rate']:.0%}"
    rows = [
        ["P reuse decisions (d2p)", num(s["decisions"])],
        ["pulled from D", f"{num(s['pulled_requests'])} ({rate})"],
        ["reusable tokens offered", num(s["reusable_tokens"])],
        ["local prefix-cache hit tokens", num(s["local_hit_tokens"])],
        ["pulled tokens", num(s["pulled_tokens"])],
        ["recomputed tokens", num(s["recomputed_tokens"])],
        ["bytes pulled (GiB)", gib(s["bytes"])],
        ["transfer time of pulls (wall ms)", ms(s["transfer_ms"])],
        ["recompute estimate of those tokens (wall ms)", ms(s["recompute_est_ms"])],
        ["saved (wall ms)", ms(s["saved_ms"])],
        ["break-even (tokens)", "–" if s["break_even_tokens"] is None else f"{s['break_even_tokens']:,.0f}"],
    ]
    return ["reuse", "value"], rows


def verification_rows(con, filters: Filters | None = None) -> tuple[list[str], list[list[str]]]:
    """P's check of D's digest per result, mismatches first."""
    rows = [
        [r["verified"], num(r["decisions"]), num(r["pulled"]), num(r["wrong_tokens"])]
        for r in reuse.verification(con, filters).to_pylist()
    ]
    return ["offered KV verified", "decisions", "pulled", "tokens from other KV"], rows


def mismatch_rows(con, filters: Filters | None = None, limit: int = 20) -> tuple[list[str], list[list[str]]]:
    """The mismatched offers, most tokens from other KV first, with the cause where the kvtrace proxy
    knows it (the dashboard's KV reuse page shows the same query first)."""
    rows = [
        [
            r["session_id"] or "–",
            num(r["turn"]),
            r["request_id"] or "–",
            r["verify_mode"] or "–",
            r["outcome"] or "–",
            num(r["first_mismatch_token"]),
            num(r["wrong_tokens"]),
            r["cause"] or "–",
            num(r["pulled_tokens"]),
        ]
        for r in reuse.mismatches(con, filters, limit=limit).to_pylist()
    ]
    cols = [
        "session",
        "turn",
        "request",
        "verify",
        "outcome",
        "first mismatch",
        "tokens from other KV",
        "cause",
        "pulled",
    ]
    return cols, rows


def decision_mix_rows(con, filters: Filters | None = None) -> tuple[list[str], list[list[str]]]:
    rows = [
        [
            r["direction"] or "–",
            r["outcome"] or "–",
            num(r["decisions"]),
            num(r["pulled_tokens"]),
            num(r["recomputed_tokens"]),
        ]
        for r in reuse.decision_mix(con, filters).to_pylist()
    ]
    return ["direction", "outcome", "decisions", "pulled tokens", "recomputed tokens"], rows


def tokens_by_source_rows(con, filters: Filters | None = None) -> tuple[list[str], list[list[str]]]:
    rows = [
        [
            num(r["turn"]),
            num(r["requests"]),
            num(r["local_hit_tokens"]),
            num(r["pulled_tokens"]),
            num(r["computed_tokens"]),
        ]
        for r in reuse.tokens_by_source(con, filters).to_pylist()
    ]
    return ["turn", "P requests", "local hit", "pulled", "computed"], rows


def retention_rows(con, filters: Filters | None = None) -> tuple[list[str], list[list[str]]]:
    rows = [
        [
            r["engine_id"] or "–",
            num(r["retained"]),
            num(r["read"]),
            num(r["expired"]),
            num(r["released"]),
            gib(r["peak_bytes"]),
            f"{(r['byte_seconds'] or 0) / GIB:,.1f}",
            num(r["blocks_never_read"]),
        ]
        for r in retention.summary(con, filters)
    ]
    return [
        "D engine",
        "retained",
        "read",
        "expired",
        "released",
        "peak GiB",
        "GiB·s (wall)",
        "blocks never read",
    ], rows


NEVER_READ_NOTE = (
    "'blocks never read' and the bytes behind them add up every turn's retention that no next turn "
    "read, over the whole run: a total of what was held in vain, not an amount held at one time "
    "(that is the peak)"
)


def latency_rows(con, filters: Filters | None = None) -> tuple[list[str], list[list[str]]]:
    rows = [
        [num(r["turn"]), num(r["calls"]), ms(r["ttft_p50_ms"]), ms(r["ttft_p90_ms"]), ms(r["task_p50_ms"])]
        for r in latency.by_turn(con, filters).to_pylist()
    ]
    return ["turn", "LLM calls", "TTFT p50 wall ms", "TTFT p90 wall ms", "turn p50 wall ms"], rows


def ci(r: dict) -> str:
    return "–" if r["ci_low"] is None else f"{r['ci_low']:.2f}–{r['ci_high']:.2f}"


def compare_rows(
    rows: list[dict], labels: tuple[str, str] = ("baseline", "candidate")
) -> tuple[list[str], list[list[str]]]:
    """:func:`kvtrace.analysis.compare.compare` rows (A = baseline, B = candidate) as a table."""
    base, cand = labels
    body = [
        [
            r["metric"],
            str(r["turn"]),
            f"{r['n_a']:,} / {r['n_b']:,}",
            ms(r["a_mean"]),
            ms(r["b_mean"]),
            ratio(r["ratio"]),
            ci(r),
            r["verdict"],
        ]
        for r in rows
    ]
    return [
        "metric",
        "turn",
        f"n ({base} / {cand})",
        f"{base} mean wall ms",
        f"{cand} mean wall ms",
        "ratio",
        "95% CI",
        "verdict",
    ], body


# -- A/B comparison (``kvtrace demo``) -----------------------------------------------------------
def model_s(value, time_scale: float) -> str:
    """Wall ms as model seconds (wall × the replay's compression ``time_scale``)."""
    return "–" if value is None else f"{value * time_scale / 1e3:,.2f}"


def ttft_rows(
    rows: list[dict], time_scale: float, labels: tuple[str, str] = ("baseline", "bidir"), metric: str = "ttft_ms"
) -> tuple[list[str], list[list[str]]]:
    """The ``metric`` rows of :func:`kvtrace.analysis.compare.compare` (per turn, then turns >= 1
    pooled): the mean of both runs in wall ms and in model seconds (wall × ``time_scale``), the
    ratio, its bootstrap interval and the verdict."""
    base, cand = labels
    cols = [
        "turn",
        "calls" if metric == "ttft_ms" else "turns",
        f"{base} wall ms",
        f"{cand} wall ms",
        "ratio",
        "95% CI",
        f"model s: {base} → {cand}",
        "verdict",
    ]
    body = [
        [
            LATER_LABEL if r["turn"] == compare.LATER else str(r["turn"]),
            num(r["n_b"]),
            ms(r["a_mean"]),
            ms(r["b_mean"]),
            ratio(r["ratio"]),
            ci(r),
            f"{model_s(r['a_mean'], time_scale)} → {model_s(r['b_mean'], time_scale)}",
            r["verdict"],
        ]
        for r in rows
        if r["metric"] == metric and r["turn"] != compare.ALL
    ]
    return cols, body


LATER_LABEL = "turns ≥1"


def prefill_work_rows(
    baseline_con,
    candidate_con,
    rows: list[dict],
    labels: tuple[str, str] = ("baseline", "bidir"),
    filters: Filters | None = None,
) -> tuple[list[str], list[list[str]]]:
    """Per turn of ``rows`` (:func:`kvtrace.analysis.compare.compare`): mean prompt tokens per P
    request, what P computed in each run, and what the candidate pulled or hit locally (all means
    per P request, from :func:`reuse.tokens_by_source`)."""
    base, cand = labels
    b_tok = {r["turn"]: r for r in reuse.tokens_by_source(baseline_con, filters).to_pylist()}
    c_tok = {r["turn"]: r for r in reuse.tokens_by_source(candidate_con, filters).to_pylist()}
    per = lambda r, col: "–" if not r or not r["requests"] else f"{r[col] / r['requests']:,.0f}"  # noqa: E731
    body = []
    for r in rows:
        if r["metric"] != "ttft_ms" or not isinstance(r["turn"], int):
            continue
        b, c = b_tok.get(r["turn"]), c_tok.get(r["turn"])
        prompt = None if not c or not c["requests"] else sum(c[k] for k in _SOURCES) / c["requests"]
        body.append(
            [
                num(r["turn"]),
                "–" if prompt is None else f"{prompt:,.0f}",
                per(b, "computed_tokens"),
                per(c, "computed_tokens"),
                per(c, "pulled_tokens"),
                per(c, "local_hit_tokens"),
            ]
        )
    cols = [
        "turn",
        "prompt tokens",
        f"computed ({base})",
        f"computed ({cand})",
        f"pulled ({cand})",
        f"local hit ({cand})",
    ]
    return cols, body


_SOURCES = ("local_hit_tokens", "pulled_tokens", "computed_tokens")


# one row per agent LLM call with what P computed for it (its d2p decision: prompt − local hit − pulled)
CALL_WORK_SQL = f"""
SELECT l.session_id, l.turn, l.ttft_ms, d.prompt_tokens, d.recomputed_tokens AS computed_tokens
FROM llm_calls l
JOIN kv_decisions d ON d.request_id = l.request_id AND d.direction = {literal(sc.DIRECTION_D2P)}
WHERE l.turn >= 1 AND l.ttft_ms IS NOT NULL
"""
SAVED_BUCKETS = ((None, 1000), (1000, 5000), (5000, None))  # tokens the candidate did not recompute


def saved_groups(baseline_con, candidate_con) -> list[dict]:
    """Calls at turns >= 1 paired across the runs by (session, turn) and grouped (:data:`SAVED_BUCKETS`)
    by how many prompt tokens the baseline's P computed that the candidate's did not (baseline
    computed − candidate computed; negative when the candidate's P computed more): the TTFT effect
    against the work reuse saves.  A baseline call routed to the P that served the conversation's
    previous turn finds the history in that P's prefix cache (little saved); one routed to the
    other P recomputes it.  Per group: ``label``, ``calls``, ``saved_tokens`` (mean),
    ``baseline_ms``, ``candidate_ms`` (mean TTFT) and ``ratio``."""
    base = {(r["session_id"], r["turn"]): r for r in query_rows(baseline_con, CALL_WORK_SQL)}
    cand = {(r["session_id"], r["turn"]): r for r in query_rows(candidate_con, CALL_WORK_SQL)}
    saved = [
        (base[k]["computed_tokens"] - cand[k]["computed_tokens"], base[k]["ttft_ms"], cand[k]["ttft_ms"])
        for k in base.keys() & cand.keys()
    ]
    out = []
    for lo, hi in SAVED_BUCKETS:
        group = [g for g in saved if (lo is None or g[0] >= lo) and (hi is None or g[0] < hi)]
        label = f"< {hi:,}" if lo is None else f"≥ {lo:,}" if hi is None else f"{lo:,} – {hi:,}"
        n = len(group)
        row = {
            "label": label,
            "calls": n,
            "saved_tokens": None,
            "baseline_ms": None,
            "candidate_ms": None,
            "ratio": None,
        }
        if n:
            row.update(
                saved_tokens=sum(g[0] for g in group) / n,
                baseline_ms=sum(g[1] for g in group) / n,
                candidate_ms=sum(g[2] for g in group) / n,
            )
            row["ratio"] = row["candidate_ms"] / row["baseline_ms"] if row["baseline_ms"] else None
        out.append(row)
    return out


def saved_rows(
    groups: list[dict], time_scale: float, labels: tuple[str, str] = ("baseline", "bidir")
) -> tuple[list[str], list[list[str]]]:
    """:func:`saved_groups` as a table: mean TTFT in wall ms and model seconds, and the ratio."""
    base, cand = labels
    cols = [
        "tokens not recomputed",
        "calls",
        "mean tokens",
        f"{base} wall ms",
        f"{cand} wall ms",
        "ratio",
        f"model s: {base} → {cand}",
    ]
    out = [
        [
            g["label"],
            num(g["calls"]),
            "–" if g["saved_tokens"] is None else f"{g['saved_tokens']:,.0f}",
            ms(g["baseline_ms"]),
            ms(g["candidate_ms"]),
            ratio(g["ratio"]),
            f"{model_s(g['baseline_ms'], time_scale)} → {model_s(g['candidate_ms'], time_scale)}",
        ]
        for g in groups
    ]
    return cols, out
