"""Did run B beat run A?  One rule, used by ``kvtrace bench`` (A/B), ``kvtrace demo``, ``kvtrace
report --compare`` and the dashboard's run comparison, so all four give the same verdict on the
same data.

Input: the values of each run as ``(metric, turn, repeat, value)`` tuples.  Metrics
(:data:`METRICS`): ``ttft_ms`` and ``latency_ms`` per LLM call, ``turn_latency_ms`` per completed
turn.  From records (``kvtrace bench``: :func:`kvtrace.bench.stats.values`) or from a store
(:func:`store_values`: the agent's ``llm_call`` spans, else the proxy's requests, and the turn
windows; see :mod:`kvtrace.analysis.latency`).  Groups: every turn index, :data:`LATER` (turns
>= 1 pooled: where reuse can pay) and :data:`ALL`.

Per metric and group:

- ``ratio`` = mean(B) / mean(A).  Means, not medians: with several prefill workers a turn's calls
  are a mix of "P has the history" and "P lacks it", whose median flips between the two modes from
  run to run, and the mean is what the total time saved is made of;
- ``ci_low`` / ``ci_high``: bootstrap 95 % interval of that ratio (each run's values resampled
  with replacement, :data:`N_BOOT` times, seeded per metric and group: reproducible, and
  independent of the values' order);
- ``noise``: run-to-run noise, with two or more repeats per run: the largest
  ``|log(mean of one repeat / mean of all)|`` over both runs (None otherwise);
- ``significant``: the interval excludes 1 and ``|log(ratio)|`` exceeds the noise (when known);
  ``verdict``: ``faster`` / ``slower`` (B against A) when significant, else ``within noise``;
  ``–`` when a run has no values.
"""

from __future__ import annotations

import math
import zlib
from collections import defaultdict
from collections.abc import Iterable

import numpy as np

METRICS = ("ttft_ms", "latency_ms", "turn_latency_ms")
LATER, ALL = "≥1", "all"
N_BOOT = 1000
FASTER, SLOWER, WITHIN_NOISE, NO_DATA = "faster", "slower", "within noise", "–"
_CHUNK_VALUES = 2_000_000  # resampled values held at once

Value = tuple[str, "int | None", int, float]


def _groups(values: Iterable[Value]) -> dict[tuple[str, object], dict[int, list[float]]]:
    """(metric, group) -> repeat -> values; every value lands in its turn's group and in ALL,
    values of turns >= 1 also in LATER."""
    out: dict[tuple[str, object], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for metric, turn, repeat, value in values:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        keys = [ALL] if turn is None else [turn, ALL] + ([LATER] if turn >= 1 else [])
        for key in keys:
            out[(metric, key)][repeat].append(float(value))
    return out


def _mean(values) -> float:
    """Exactly rounded (math.fsum), so the order of the values never matters."""
    return math.fsum(values) / len(values)


def _order(group) -> tuple:
    return (0, group) if isinstance(group, int) else (1, 0 if group == LATER else 1)


def _seed(seed: int, metric: str, group) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(f"{metric}:{group}".encode())])


def bootstrap_ratio(a: list[float], b: list[float], rng: np.random.Generator, n: int = N_BOOT) -> tuple[float, float]:
    """95 % interval of mean(b) / mean(a), resampling each side with replacement."""
    xa, xb = np.sort(np.asarray(a, dtype=float)), np.sort(np.asarray(b, dtype=float))
    step = max(1, _CHUNK_VALUES // max(len(xa), len(xb)))
    ratios = []
    for start in range(0, n, step):
        k = min(step, n - start)
        ma = xa[rng.integers(0, len(xa), size=(k, len(xa)))].mean(axis=1)
        mb = xb[rng.integers(0, len(xb), size=(k, len(xb)))].mean(axis=1)
        ratios.append(mb[ma > 0] / ma[ma > 0])
    ratios = np.concatenate(ratios)
    if not len(ratios):
        return math.nan, math.nan
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float(low), float(high)


def repeat_noise(by_repeat: dict[int, list[float]]) -> float | None:
    """Largest |log(mean of one repeat / mean of all)|; None with fewer than two repeats."""
    pooled = [v for vs in by_repeat.values() for v in vs]
    if len(by_repeat) < 2 or not pooled or _mean(pooled) <= 0:
        return None
    m = _mean(pooled)
    devs = [abs(math.log(_mean(vs) / m)) for vs in by_repeat.values() if vs and _mean(vs) > 0]
    return max(devs) if devs else None


def compare(a: Iterable[Value], b: Iterable[Value], *, seed: int = 0, n_boot: int = N_BOOT) -> list[dict]:
    """One row per (metric, group), metrics in :data:`METRICS` order, groups turn by turn then
    :data:`LATER` and :data:`ALL` (see module doc for the columns)."""
    ga, gb = _groups(a), _groups(b)
    rows = []
    for metric in METRICS:
        groups = sorted({g for m, g in (*ga, *gb) if m == metric}, key=_order)
        for group in groups:
            ra, rb = ga.get((metric, group), {}), gb.get((metric, group), {})
            va, vb = [v for vs in ra.values() for v in vs], [v for vs in rb.values() for v in vs]
            row = {
                "metric": metric,
                "turn": group,
                "n_a": len(va),
                "n_b": len(vb),
                "a_mean": _mean(va) if va else None,
                "b_mean": _mean(vb) if vb else None,
                "ratio": None,
                "ci_low": None,
                "ci_high": None,
                "noise": None,
                "significant": False,
                "verdict": NO_DATA,
            }
            if va and vb and row["a_mean"] > 0:
                row["ratio"] = row["b_mean"] / row["a_mean"]
                row["ci_low"], row["ci_high"] = bootstrap_ratio(va, vb, _seed(seed, metric, group), n_boot)
                noises = [x for x in (repeat_noise(ra), repeat_noise(rb)) if x is not None]
                row["noise"] = max(noises) if noises else None
                outside = not (row["ci_low"] <= 1.0 <= row["ci_high"])
                distance = abs(math.log(row["ratio"])) if row["ratio"] > 0 else math.inf
                row["significant"] = bool(outside and (row["noise"] is None or distance > row["noise"]))
                row["verdict"] = (FASTER if row["ratio"] < 1 else SLOWER) if row["significant"] else WITHIN_NOISE
            rows.append(row)
    return rows


def row(rows: list[dict], metric: str, turn) -> dict | None:
    """The row of ``metric`` and ``turn`` (a turn index, :data:`LATER` or :data:`ALL`)."""
    return next((r for r in rows if r["metric"] == metric and r["turn"] == turn), None)


def store_values(con, filters=None) -> list[Value]:
    """A store's values for :func:`compare` (repeat 0: a trace directory is one run)."""
    from kvtrace.analysis import latency

    out: list[Value] = []
    for r in latency.call_values(con, filters).to_pylist():
        out.append(("ttft_ms", r["turn"], 0, r["ttft_ms"]))
        out.append(("latency_ms", r["turn"], 0, r["latency_ms"]))
    out += [("turn_latency_ms", r["turn"], 0, r["latency_ms"]) for r in latency.turn_values(con, filters).to_pylist()]
    return out


def compare_runs(baseline_con, candidate_con, filters=None, *, seed: int = 0, n_boot: int = N_BOOT) -> list[dict]:
    """:func:`compare` of two stores: A = the baseline, B = the candidate."""
    return compare(store_values(baseline_con, filters), store_values(candidate_con, filters), seed=seed, n_boot=n_boot)
