"""Summaries of bench records, the A/B comparison with its noise test, and the text tables.

Called by :mod:`kvtrace.bench.bench` (``BenchResult.summary()``, ``ABResult.comparison``) and
printed by :mod:`kvtrace.bench.cli`.  Pure functions over the record dataclasses of
:mod:`kvtrace.bench.runner`; no numpy needed.

A/B significance: for every turn index the ratio B/A of median TTFT (and of request and turn
latency) gets a bootstrap 95 % interval (requests resampled within each side, seeded).  With
``--repeat`` >= 2 the run-to-run noise of each side is the largest relative deviation of one
repeat's median from the pooled median; a difference is marked when the interval excludes 1 *and*
the ratio's distance from 1 (in log terms) exceeds that noise.
"""

from __future__ import annotations

import math
import random
from collections import Counter, defaultdict
from statistics import mean, median

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
        per_turn.append({
            "turn": idx,
            "labels": sorted({t.label for t in trs}),
            **{k: v for k, v in _requests(reqs).items() if k != "count"},
            "requests": len(reqs),
            "turns": len(trs),
            "turn_latency_ms": describe(t.latency_ms for t in trs if t.error is None),
            "tool_ms": describe(t.tool_ms for t in trs),
            "work_ms": describe(t.work_ms for t in trs),
        })
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
METRICS = ("ttft_ms", "latency_ms", "turn_latency_ms")


def _values(result, metric: str, turn: int | None, repeat: int | None = None) -> list[float]:
    if metric == "turn_latency_ms":
        rows = [(t.turn, t.repeat, t.latency_ms) for t in result.turns if t.error is None]
    else:
        rows = [(r.turn, r.repeat, getattr(r, metric)) for r in result.requests if r.error is None or metric == "ttft_ms"]
    return [v for t, rep, v in rows if v is not None and (turn is None or t == turn) and (repeat is None or rep == repeat)]


def bootstrap_ratio(a: list[float], b: list[float], rng: random.Random, n: int = 1000) -> tuple[float, float]:
    """95 % interval of median(b) / median(a), resampling each side with replacement."""
    ratios = []
    for _ in range(n):
        ma = median(rng.choices(a, k=len(a)))
        mb = median(rng.choices(b, k=len(b)))
        if ma > 0:
            ratios.append(mb / ma)
    if not ratios:
        return math.nan, math.nan
    return percentile(ratios, 2.5), percentile(ratios, 97.5)


def repeat_noise(result, metric: str, turn: int | None) -> float | None:
    """Largest |log(median of one repeat / pooled median)|; None with fewer than two repeats."""
    pooled = _values(result, metric, turn)
    reps = sorted({r.repeat for r in result.requests})
    if len(reps) < 2 or not pooled or median(pooled) <= 0:
        return None
    m = median(pooled)
    devs = [abs(math.log(median(v) / m)) for rep in reps if (v := _values(result, metric, turn, rep)) and median(v) > 0]
    return max(devs) if devs else None


def compare(a, b, *, seed: int = 0, n_boot: int = 1000) -> list[dict]:
    """Rows (metric, turn) with medians, ratio B/A, its bootstrap interval, the noise and
    ``significant``.  ``turn`` None is the all-turns row."""
    rng = random.Random(f"kvtrace-bench:ab:{seed}")
    turns = sorted({r.turn for r in a.requests} | {r.turn for r in b.requests})
    rows = []
    for metric in METRICS:
        for turn in [*turns, None]:
            va, vb = _values(a, metric, turn), _values(b, metric, turn)
            row = {"metric": metric, "turn": turn, "n_a": len(va), "n_b": len(vb),
                   "a_p50": median(va) if va else None, "b_p50": median(vb) if vb else None,
                   "ratio": None, "ci_low": None, "ci_high": None, "noise": None, "significant": False}
            if va and vb and row["a_p50"] > 0:
                row["ratio"] = row["b_p50"] / row["a_p50"]
                row["ci_low"], row["ci_high"] = bootstrap_ratio(va, vb, rng, n_boot)
                noises = [x for x in (repeat_noise(a, metric, turn), repeat_noise(b, metric, turn)) if x is not None]
                row["noise"] = max(noises) if noises else None
                outside = not (row["ci_low"] <= 1.0 <= row["ci_high"])
                distance = abs(math.log(row["ratio"])) if row["ratio"] > 0 else math.inf
                beyond_noise = row["noise"] is None or distance > row["noise"]
                row["significant"] = bool(outside and beyond_noise)
            rows.append(row)
    return rows


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
    line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def format_summary(summary: dict, title: str = "") -> str:
    req = summary["requests"]
    out = [title] if title else []
    out.append(
        f"requests {req['count']}  errors {req['errors']}  interrupted {req['interrupted']}  "
        f"pulled tokens {req['pulled_tokens']}  outcomes {_outcomes(req['outcomes'])}"
    )
    header = ["turn", "reqs", "ttft p50", "ttft p90", "tpot p50", "lat p50", "turn p50", "turn p90", "outcomes"]
    rows = [
        [str(t["turn"]), str(t["requests"]), _f(_p(t["ttft_ms"])), _f(_p(t["ttft_ms"], "p90")), _f(_p(t["tpot_ms"]), 2),
         _f(_p(t["latency_ms"])), _f(_p(t["turn_latency_ms"])), _f(_p(t["turn_latency_ms"], "p90")), _outcomes(t["outcomes"])]
        for t in summary["per_turn"]
    ]
    rows.append(["all", str(req["count"]), _f(_p(req["ttft_ms"])), _f(_p(req["ttft_ms"], "p90")), _f(_p(req["tpot_ms"]), 2),
                 _f(_p(req["latency_ms"])), "", "", ""])
    out.append(_table(header, rows))
    s = summary["sessions"]
    out.append(f"sessions {s['count']}  errors {s['errors']}  wall p50 {_f(_p(s['wall_ms']))} ms  "
               f"active p50 {_f(_p(s['active_ms']))} ms  (times in ms)")
    return "\n".join(out)


def _outcomes(counts: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(counts.items())) or "-"


def format_comparison(rows: list[dict], label_a: str = "A", label_b: str = "B") -> str:
    header = ["metric", "turn", f"{label_a} p50", f"{label_b} p50", "B/A", "95% CI", "noise", ""]
    body = [
        [r["metric"], "all" if r["turn"] is None else str(r["turn"]), _f(r["a_p50"]), _f(r["b_p50"]),
         _f(r["ratio"], 3), f"{_f(r['ci_low'], 3)}-{_f(r['ci_high'], 3)}",
         "-" if r["noise"] is None else f"{math.exp(r['noise']) - 1:.1%}", "*" if r["significant"] else ""]
        for r in rows
    ]
    note = "* = B/A differs beyond run-to-run noise (bootstrap 95% CI excludes 1; with --repeat, also beyond repeat spread)"
    return _table(header, body) + "\n" + note
