"""Summaries of bench records, the values an A/B comparison is made on, and the text tables.

Called by :mod:`kvtrace.bench.api` (``BenchResult.summary()``, ``ABResult.comparison``) and
printed by :mod:`kvtrace.cli.bench`.  Pure functions over the record dataclasses of
:mod:`kvtrace.bench.runner`.

A/B significance is :mod:`kvtrace.analysis.compare`'s rule (the one the demo, the report and the
dashboard use): per metric and turn index the ratio B/A of the means with a bootstrap 95 %
interval; with ``--repeat`` >= 2 also the run-to-run noise between repeats.  :func:`values` turns a
run's records into that module's input.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from statistics import mean

from kvtrace import semconv as sc

PCTS = (50, 90, 99)


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method)."""
    xs = sorted(values)
    if not xs:
        raise ValueError("no values")
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def describe(values) -> dict | None:
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return None
    out = {"count": len(xs), "mean": mean(xs), "min": min(xs), "max": max(xs)}
    out.update({f"p{q}": percentile(xs, q) for q in PCTS})
    return out


def _requests(requests) -> dict:
    ok = [r for r in requests if r.error is None]
    return {
        "count": len(requests),
        "errors": sum(1 for r in requests if r.error is not None and not r.interrupted),
        "interrupted": sum(1 for r in requests if r.interrupted),
        "ttft_ms": describe(r.ttft_ms for r in requests),
        "tpot_ms": describe(r.tpot_ms for r in ok),
        "latency_ms": describe(r.latency_ms for r in ok),
        "input_tokens": describe(r.input_tokens for r in ok),
        "output_tokens": describe(r.output_tokens for r in ok),
        "outcomes": dict(Counter(r.outcome or "none" for r in requests)),
        "pulled_tokens": sum(r.pulled_tokens or 0 for r in requests),
        # continuity breaks: the proxy saw the prompt diverge from what D held and did not offer it
        "diverged": sum(1 for r in requests if r.offer_reason == sc.OFFER_DIVERGED),
        "diverged_recomputed_tokens": sum(
            r.recomputed_tokens or 0 for r in requests if r.offer_reason == sc.OFFER_DIVERGED
        ),
    }


def summarize(requests, turns, sessions) -> dict:
    """Per request, per turn index and per session statistics (JSON-ready)."""
    by_turn_req, by_turn = defaultdict(list), defaultdict(list)
    for r in requests:
        by_turn_req[r.turn].append(r)
    for t in turns:
        by_turn[t.turn].append(t)
    per_turn = []
    for idx in sorted(set(by_turn_req) | set(by_turn)):
        reqs, trs = by_turn_req.get(idx, []), by_turn.get(idx, [])
        per_turn.append(
            {
                "turn": idx,
                "labels": sorted({t.label for t in trs}),
                **{k: v for k, v in _requests(reqs).items() if k != "count"},
                "requests": len(reqs),
                "turns": len(trs),
                "turn_latency_ms": describe(t.latency_ms for t in trs if t.error is None),
                "tool_ms": describe(t.tool_ms for t in trs),
                "work_ms": describe(t.work_ms for t in trs),
            }
        )
    return {
        "requests": _requests(requests),
        "per_turn": per_turn,
        "sessions": {
            "count": len(sessions),
            "errors": sum(1 for s in sessions if s.error),
            "wall_ms": describe(s.wall_ms for s in sessions if not s.error),
            "active_ms": describe(s.active_ms for s in sessions if not s.error),
        },
    }


# -- A/B ---------------------------------------------------------------------------------------
def values(result) -> list[tuple]:
    """``(metric, turn, repeat, value)`` of a run for :func:`kvtrace.analysis.compare.compare`:
    TTFT of every request that got a first token, latency of every request that completed, latency
    of every completed turn."""
    out = [("ttft_ms", r.turn, r.repeat, r.ttft_ms) for r in result.requests if r.ttft_ms is not None]
    out += [
        ("latency_ms", r.turn, r.repeat, r.latency_ms)
        for r in result.requests
        if r.error is None and r.latency_ms is not None
    ]
    out += [("turn_latency_ms", t.turn, t.repeat, t.latency_ms) for t in result.turns if t.error is None]
    return out


# -- text tables ------------------------------------------------------------------------------
def _f(v, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _p(d: dict | None, key: str = "p50") -> float | None:
    return d.get(key) if d else None


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def format_summary(summary: dict, title: str = "") -> str:
    req = summary["requests"]
    out = [title] if title else []
    out.append(
        f"requests {req['count']}  errors {req['errors']}  interrupted {req['interrupted']}  "
        f"pulled tokens {req['pulled_tokens']}  outcomes {_outcomes(req['outcomes'])}"
    )
    if req.get("diverged"):
        out.append(
            f"continuity breaks {req['diverged']} (prompt diverged from what D held; P recomputed "
            f"{req['diverged_recomputed_tokens']} tokens on them)"
        )
    header = ["turn", "reqs", "ttft p50", "ttft p90", "tpot p50", "lat p50", "turn p50", "turn p90", "outcomes"]
    rows = [
        [
            str(t["turn"]),
            str(t["requests"]),
            _f(_p(t["ttft_ms"])),
            _f(_p(t["ttft_ms"], "p90")),
            _f(_p(t["tpot_ms"]), 2),
            _f(_p(t["latency_ms"])),
            _f(_p(t["turn_latency_ms"])),
            _f(_p(t["turn_latency_ms"], "p90")),
            _outcomes(t["outcomes"]),
        ]
        for t in summary["per_turn"]
    ]
    rows.append(
        [
            "all",
            str(req["count"]),
            _f(_p(req["ttft_ms"])),
            _f(_p(req["ttft_ms"], "p90")),
            _f(_p(req["tpot_ms"]), 2),
            _f(_p(req["latency_ms"])),
            "",
            "",
            "",
        ]
    )
    out.append(_table(header, rows))
    s = summary["sessions"]
    out.append(
        f"sessions {s['count']}  errors {s['errors']}  wall p50 {_f(_p(s['wall_ms']))} ms  "
        f"active p50 {_f(_p(s['active_ms']))} ms  (times in ms)"
    )
    return "\n".join(out)


def _outcomes(counts: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(counts.items())) or "-"


def format_comparison(rows: list[dict], label_a: str = "A", label_b: str = "B") -> str:
    header = ["metric", "turn", f"{label_a} mean", f"{label_b} mean", "B/A", "95% CI", "noise", "verdict"]
    body = [
        [
            r["metric"],
            str(r["turn"]),
            _f(r["a_mean"]),
            _f(r["b_mean"]),
            _f(r["ratio"], 3),
            f"{_f(r['ci_low'], 3)}-{_f(r['ci_high'], 3)}",
            "-" if r["noise"] is None else f"{math.exp(r['noise']) - 1:.1%}",
            r["verdict"],
        ]
        for r in rows
    ]
    note = (
        "verdict: B against A, faster/slower when the bootstrap 95% CI of B/A (means) excludes 1 and, with "
        "--repeat, the ratio is beyond the repeats' spread (noise)"
    )
    return _table(header, body) + "\n" + note
