"""Plain-text / Markdown tables of the analysis results, shared by ``kvtrace demo`` (console)
and ``kvtrace report`` (Markdown and HTML).

Each ``*_rows`` function returns (columns, rows of display strings) straight from the query
functions, so what is printed is exactly what the views hold (ms rounded to 0.1).
"""

from __future__ import annotations

from kvtrace.analysis import latency, retention, reuse, sessions
from kvtrace.analysis.breakdown import PART_COLUMNS
from kvtrace.analysis.filters import Filters

PART_NAMES = dict(zip(PART_COLUMNS, ("input processing", "generation", "tool waits", "app work")))


def ms(value) -> str:
    return "–" if value is None else f"{value:,.1f}"


def num(value) -> str:
    return "–" if value is None else f"{value:,}"


def ratio(value) -> str:
    return "–" if value is None else f"{value:.2f}"


def gib(value) -> str:
    return "–" if value is None else f"{value / 2**30:,.2f}"


def md_table(columns: list[str], rows: list[list[str]]) -> str:
    """A Markdown pipe table, columns padded so it also reads well on a terminal."""
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(columns)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(columns), sep, *(line(r) for r in rows)])


def breakdown_totals_rows(con, filters: Filters | None = None) -> tuple[list[str], list[list[str]]]:
    tot = sessions.totals(con, filters)
    wall = tot["wall_ms"] or 0
    rows = [[name, ms(tot[col]), f"{tot[col] / wall:.1%}" if wall else "–"] for col, name in PART_NAMES.items()]
    rows.append(["wall time", ms(wall), "100.0%" if wall else "–"])
    return ["part", "ms (all sessions)", "share"], rows


def breakdown_rows(con, filters: Filters | None = None, limit: int = 20) -> tuple[list[str], list[list[str]]]:
    cols = ["session", "turns", "wall ms", "input ms", "generation ms", "tool ms", "app ms"]
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
        ["transfer time of pulls (ms)", ms(s["transfer_ms"])],
        ["recompute estimate of those tokens (ms)", ms(s["recompute_est_ms"])],
        ["saved (ms)", ms(s["saved_ms"])],
        ["break-even (tokens)", "–" if s["break_even_tokens"] is None else f"{s['break_even_tokens']:,.0f}"],
    ]
    return ["reuse", "value"], rows


def decision_mix_rows(con, filters: Filters | None = None) -> tuple[list[str], list[list[str]]]:
    rows = [[r["direction"] or "–", r["outcome"] or "–", num(r["decisions"]), num(r["pulled_tokens"]),
             num(r["recomputed_tokens"])] for r in reuse.decision_mix(con, filters).to_pylist()]
    return ["direction", "outcome", "decisions", "pulled tokens", "recomputed tokens"], rows


def tokens_by_source_rows(con, filters: Filters | None = None) -> tuple[list[str], list[list[str]]]:
    rows = [[num(r["turn"]), num(r["requests"]), num(r["local_hit_tokens"]), num(r["pulled_tokens"]),
             num(r["computed_tokens"])] for r in reuse.tokens_by_source(con, filters).to_pylist()]
    return ["turn", "P requests", "local hit", "pulled", "computed"], rows


def retention_rows(con, filters: Filters | None = None) -> tuple[list[str], list[list[str]]]:
    rows = [[r["engine_id"] or "–", num(r["retained"]), num(r["read"]), num(r["expired"]), num(r["released"]),
             gib(r["peak_bytes"]), f"{(r['byte_seconds'] or 0) / 2**30:,.1f}", num(r["blocks_never_read"])]
            for r in retention.summary(con, filters)]
    return ["D engine", "retained", "read", "expired", "released", "peak GiB", "GiB·s", "blocks never read"], rows


def latency_rows(con, filters: Filters | None = None) -> tuple[list[str], list[list[str]]]:
    rows = [[num(r["turn"]), num(r["calls"]), ms(r["ttft_p50_ms"]), ms(r["ttft_p90_ms"]), ms(r["task_p50_ms"])]
            for r in latency.by_turn(con, filters).to_pylist()]
    return ["turn", "LLM calls", "TTFT p50 ms", "TTFT p90 ms", "turn p50 ms"], rows


def compare_rows(baseline_con, candidate_con, filters: Filters | None = None) -> tuple[list[str], list[list[str]]]:
    rows = [[num(r["turn"]), ms(r["ttft_p50_ms_baseline"]), ms(r["ttft_p50_ms_candidate"]), ratio(r["ttft_p50_ms_ratio"]),
             ms(r["task_p50_ms_baseline"]), ms(r["task_p50_ms_candidate"]), ratio(r["task_p50_ms_ratio"])]
            for r in latency.compare_runs(baseline_con, candidate_con, filters)]
    return ["turn", "TTFT p50 baseline", "TTFT p50 candidate", "ratio", "turn p50 baseline", "turn p50 candidate",
            "ratio"], rows
