"""What-if advisor: replay recorded traffic under other retention TTLs and recompute thresholds.

:func:`run` loads a store (:mod:`.data`) and replays it on a grid of
(``decoder_kv_blocks_ttl``, ``kv_recompute_threshold``) settings, from what they share (:mod:`.fixed`,
computed once); :func:`recommend` picks one.
Pure functions over the recorded spans: no servers, nothing re-executed.

Per setting (TTL ``T``, threshold ``θ``, proxy offer margin ``m``), every recorded d2p decision is
decided again with vLLM's rules (:mod:`kvtrace.kvrules`, the code the simulator runs):

1. **offer**: the proxy offers the session's previous blocks while its entry is at most ``T - m``
   old (the recorded entry age; the recorded gap when no proxy recorded one);
2. **decision**: ``count = min(D's tokens, prompt) - local hit``; pulled, below threshold, local
   hit or no remote (:func:`kvrules.d2p_outcome`) from the recorded prompt, local-hit and
   reusable tokens; where P ran ``verify: enforce``, a pull of more than the verified tokens it
   recorded loads only those, or is ``unverified`` (recomputed) when they miss the threshold
   (:func:`kvrules.enforced_outcome`);
3. **expiry**: a pull whose blocks have at most 5 s left at the recorded gap (``T - gap``; vLLM's
   own measure ``ttl - expiry_remaining_s`` when it was recorded) is declined ``expired``, which
   under ``kv_load_failure_policy=fail`` (vLLM's default, recorded on the decision) fails the
   request: these are the replay's predicted failures.  A recorded ``failed`` load stays failed
   while the replay still pulls.

D's retention intervals are rebuilt: a turn's blocks are held from its decode end until the
session's next decision reads them (pull) or releases them (an offered decision that does not
pull), else until ``T`` passes or the recording ends, whichever is first.  GiB·s and the peak
per D engine come from those intervals (model seconds).

TTFT per request = the recorded TTFT (proxy span) − the recorded prefill compute and transfer +
the replay's: recomputed tokens at that P engine's observed prefill rate, pulled tokens at the
fitted transfer cost (recorded transfer time when the pull is the same).  Requests without a
recorded TTFT (failed ones) and requests the replay predicts to fail are left out.

With the recorded setting the replay gives back the recorded outcomes, tokens, GiB·s and TTFT
exactly (the ``recorded`` row); ``tests/analysis/whatif/test_replay.py`` checks that, and
``tests/analysis/whatif/test_replay_predicts_simulator.py`` checks the other rows against the
simulator run at those settings.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from kvtrace import kvrules
from kvtrace import semconv as sc
from kvtrace.analysis.whatif.data import Recorded, WhatIfError, load
from kvtrace.analysis.whatif.fixed import _Fixed, _fixed
from kvtrace.store.units import GIB

DEFAULT_TTLS = (0, 30, 60, 120, 240, 480, 900, 1800)
DEFAULT_THRESHOLDS = (16, 32, 64, 128, 256, 512)
COLUMNS = (
    "ttl_s",
    "threshold",
    "decisions",
    "pulled",
    "expired",
    "below_threshold",
    "no_remote",
    "local_hit",
    "failed",
    "unverified",
    "pulled_tokens",
    "recomputed_tokens",
    "gib_s_held",
    "peak_gib_held",
    "ttft_mean_ms",
    "ttft_p90_ms",
    "recorded",
)
OUTCOME_COLUMNS = ("pulled", "expired", "below_threshold", "no_remote", "local_hit", "failed", "unverified")
TTFT_TOLERANCE = 0.05  # "within 5 % of the best TTFT"

__all__ = [
    "COLUMNS",
    "DEFAULT_THRESHOLDS",
    "DEFAULT_TTLS",
    "Replay",
    "WhatIfError",
    "load",
    "recommend",
    "replay",
    "run",
    "settings_grid",
]


@dataclass
class Replay:
    """One setting's result: ``row`` (the :data:`COLUMNS`), per-D-engine peaks and the pieces the
    dashboard plots (``codes``: outcome per decision, ``ttft_ms``: per request, model ms)."""

    row: dict
    offer_margin_s: float  # the proxy's offer margin replayed
    peak_bytes: dict  # D engine id -> peak bytes held
    failures: int  # requests predicted to fail (expired / failed loads under policy fail)
    codes: np.ndarray
    ttft_ms: np.ndarray


def settings_grid(rec: Recorded, ttls=DEFAULT_TTLS, thresholds=DEFAULT_THRESHOLDS) -> list[tuple[float | None, int]]:
    """TTL x threshold, plus the recorded setting when the grid lacks it: ``(None, threshold)``
    when the decode workers ran different TTLs (each keeps its own); that one sorts first."""
    grid = [(float(t), int(h)) for t in ttls for h in thresholds]
    recorded = (None if rec.mixed else rec.ttl_s, rec.threshold)
    if recorded not in grid:
        grid.append(recorded)
    return sorted(grid, key=lambda s: (s[0] is not None, s[0] or 0.0, s[1]))


def prepare(
    rec: Recorded, grid: list[tuple[float, int]], offer_margin_s: float | None = None, workers: int | None = None
) -> None:
    """Compute what the settings of ``grid`` share before replaying them in threads (``workers``
    threads, default: CPU count, at most 4)."""
    fx = _fixed(rec)
    margin = rec.offer_margin_s if offer_margin_s is None else offer_margin_s
    for threshold in sorted({h for _, h in grid}):
        fx.threshold(rec, threshold)
    with ThreadPoolExecutor(_workers(workers)) as pool:
        list(pool.map(lambda t: fx.ttl(rec, t, margin), sorted({t for t, _ in grid}, key=lambda t: (t is not None, t))))


def _workers(workers: int | None) -> int:
    """``workers``, default the CPU count, at most 4."""
    return workers or min(4, os.cpu_count() or 1)


def decide(rec: Recorded, ttl_s: float | None, threshold: int, offer_margin_s: float) -> tuple[np.ndarray, np.ndarray]:
    """(outcome codes, offered) of every recorded decision under one setting."""
    fx = _fixed(rec)
    t = fx.ttl(rec, ttl_s, offer_margin_s)
    codes = np.where(t["offered"], fx.threshold(rec, threshold), kvrules.NO_REMOTE).astype(np.int8)
    pull = codes == kvrules.PULLED
    expired = pull & t["declined"]
    codes[expired] = kvrules.EXPIRED
    codes[pull & ~expired & fx.failed_rec] = kvrules.FAILED
    return codes, t["offered"]


def replay(rec: Recorded, ttl_s: float | None, threshold: int, offer_margin_s: float | None = None) -> Replay:
    """Replay every recorded decision and retention under one setting (``ttl_s`` None: each D
    keeps the TTL it recorded, the recorded setting of a run whose Ds ran different TTLs; its
    row's ``ttl_s`` is then None)."""
    margin = rec.offer_margin_s if offer_margin_s is None else offer_margin_s
    fx = _fixed(rec)
    codes, _ = decide(rec, ttl_s, threshold, margin)
    pulled = codes == kvrules.PULLED
    at = fx.ttft_at[codes]
    ttft = fx.ttft.take(at + fx.d_index)
    gib_s, peaks = _held(rec, fx, ttl_s, margin, codes)
    counts = np.bincount(codes.view(np.uint8), minlength=len(kvrules.CODE))
    valid = ttft[~np.isnan(ttft)]
    mean = float(valid.mean()) if valid.size else None  # before the percentile reorders ``valid``
    not_pulled = int((fx.extra_recomputed * ~pulled).sum())
    row = {
        "ttl_s": None if ttl_s is None else float(ttl_s),
        "threshold": int(threshold),
        "decisions": int(rec.decisions),
        **{name: int(counts[kvrules.CODE[name]]) for name in OUTCOME_COLUMNS},
        "pulled_tokens": int((fx.pull_amount * pulled).sum()),
        "recomputed_tokens": fx.recomputed_if_all_pulled + not_pulled,
        "gib_s_held": gib_s,
        "peak_gib_held": max(peaks.values(), default=0) / GIB,
        "ttft_mean_ms": mean,
        "ttft_p90_ms": float(np.percentile(valid, 90, overwrite_input=True)) if valid.size else None,
        "recorded": bool(
            ttl_s == (None if rec.mixed else rec.ttl_s) and threshold == rec.threshold and margin == rec.offer_margin_s
        ),
    }
    lost = (codes == kvrules.EXPIRED) | (codes == kvrules.FAILED)
    failures = int(np.count_nonzero(lost & rec.d_fail_policy))  # the request fails under policy "fail"
    return Replay(row, margin, peaks, failures, codes, ttft)


def _held(rec: Recorded, fx: _Fixed, ttl_s: float | None, margin: float, codes: np.ndarray) -> tuple:
    """(GiB·s held on every D, {D engine: peak bytes}) with D's intervals rebuilt under ``ttl_s``:
    held until the session's next decision reads them (pull) or releases them (offered, not
    pulled), else until the TTL or the end of the recording."""
    t = fx.ttl(rec, ttl_s, margin)
    code = codes[fx.at]
    read = t["off_at"] & (code == kvrules.PULLED)
    released = t["off_at"] & (code != kvrules.PULLED) & (code != kvrules.EXPIRED) & (code != kvrules.FAILED)
    fate = 2 - 2 * read.view(np.int8) - released.view(np.int8)  # 0 read, 1 released, 2 unconsumed
    at = fate.astype(np.intp) * fx.n_r + fx.r_index
    # a plain pairwise sum, not np.dot: BLAS threads would spin on the cores the replay workers use
    gib_s = float(np.add.reduce(t["held"].take(at))) / 1e9 * rec.time_scale / GIB
    k_end = t["k_end"].take(at)
    peaks = {}
    for engine, part, cum in zip(rec.d_engines, rec.r_by_engine, fx.cum_bytes, strict=True):
        peaks[engine] = _peak(k_end[part], rec.r_bytes[part], cum)
    return gib_s, peaks


def _peak(k_end: np.ndarray, nbytes: np.ndarray, held_by_start: np.ndarray) -> int:
    """Largest sum of bytes held at once on one D: at the start of interval ``i`` (intervals
    sorted by start, ``held_by_start`` = cumsum of ``nbytes``), minus the bytes of every interval
    whose end is at or before that start (``k_end`` <= ``i``, see :func:`.fixed._first_start_at`)."""
    if k_end.size == 0:
        return 0
    n = k_end.size
    if held_by_start[-1] < 2**53:  # float sums of integers are exact below 2**53
        gone = np.bincount(k_end, weights=nbytes, minlength=n + 1)[:n].astype(np.int64)
    else:
        gone = np.zeros(n + 1, dtype=np.int64)
        np.add.at(gone, k_end, nbytes)
        gone = gone[:n]
    return int((held_by_start - np.cumsum(gone)).max())


def run(
    con,
    ttls=DEFAULT_TTLS,
    thresholds=DEFAULT_THRESHOLDS,
    offer_margin_s: float | None = None,
    workers: int | None = None,
) -> tuple[Recorded, list[Replay]]:
    """Load the store and replay every setting of the grid (recorded setting included), in
    TTL-then-threshold order; ``workers`` threads (numpy releases the GIL; default: CPU count, at most 4)."""
    rec = load(con)
    grid = settings_grid(rec, ttls, thresholds)
    workers = _workers(workers)
    prepare(rec, grid, offer_margin_s, workers)
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(lambda s: replay(rec, s[0], s[1], offer_margin_s), grid))
    return rec, results


def recommend(rec: Recorded, results: list[Replay], budget_gib: float | None = None) -> dict:
    """The setting to use and why: the threshold of the grid nearest the observed break-even,
    then (at that threshold, among the settings predicting the fewest failures) the smallest TTL
    within 5 % of the best mean TTFT, or with ``budget_gib`` the best TTFT whose peak GiB held on a
    D fits the budget.  Without TTFT data, recomputed tokens rank the settings."""
    threshold, why_threshold = _threshold(rec, sorted({r.row["threshold"] for r in results}))
    pool = [r for r in results if r.row["threshold"] == threshold and r.row["ttl_s"] is not None]
    fewest = min(r.failures for r in pool)
    pool = [r for r in pool if r.failures == fewest]
    metric = "ttft_mean_ms" if all(r.row["ttft_mean_ms"] is not None for r in pool) else "recomputed_tokens"
    best = min(pool, key=lambda r: (r.row[metric], r.row["ttl_s"]))
    pick, why_ttl = _ttl(pool, best, metric, budget_gib)
    recorded = next((r for r in results if r.row["recorded"]), None)
    return {
        "ttl_s": pick.row["ttl_s"],
        "threshold": threshold,
        "row": pick.row,
        "best": best.row,
        "recorded": recorded.row if recorded else None,
        "metric": metric,
        "why_threshold": why_threshold,
        "why_ttl": why_ttl,
        "failures": pick.failures,
        "peak_bytes": pick.peak_bytes,
        "offer_margin_s": pick.offer_margin_s,
    }


def _threshold(rec: Recorded, thresholds: list[int]) -> tuple[int, str]:
    be = rec.calibration.break_even_tokens
    if be is not None:
        return min(thresholds, key=lambda t: (abs(t - be), t)), f"nearest the observed break-even of {be:,.0f} tokens"
    if rec.calibration.transfers.get(None):
        return thresholds[-1], "pulling never beat recomputing at the observed rates: the largest threshold"
    pick = rec.threshold if rec.threshold in thresholds else thresholds[len(thresholds) // 2]
    return pick, "no successful d2p transfer to calibrate the break-even: the recorded threshold"


def _ttl(pool: list[Replay], best: Replay, metric: str, budget_gib: float | None) -> tuple[Replay, str]:
    if budget_gib is None:
        limit = best.row[metric] * (1 + TTFT_TOLERANCE)
        pick = min((r for r in pool if r.row[metric] <= limit), key=lambda r: r.row["ttl_s"])
        return pick, f"smallest TTL within {TTFT_TOLERANCE:.0%} of the best {metric}"
    fits = [r for r in pool if r.row["peak_gib_held"] <= budget_gib]
    if fits:
        return min(
            fits, key=lambda r: (r.row[metric], r.row["ttl_s"])
        ), f"best {metric} with peak GiB held <= {budget_gib:g}"
    return min(
        pool, key=lambda r: (r.row["peak_gib_held"], r.row[metric])
    ), f"no setting fits {budget_gib:g} GiB: the one holding the least"


def recommendation_lines(rec: Recorded, rc: dict) -> list[str]:
    """The recommendation and the numbers behind it, as printed by ``kvtrace whatif``."""
    row, recd, metric = rc["row"], rc["recorded"], rc["metric"]
    cal = rec.calibration
    unit = "ms" if metric == "ttft_mean_ms" else "tokens"
    out = [
        f"Recommendation: decoder_kv_blocks_ttl {row['ttl_s']:g} s, kv_recompute_threshold {rc['threshold']} "
        f"(proxy --conversation-ttl {max(row['ttl_s'] - rc['offer_margin_s'], 0):g} s with the "
        f"{rc['offer_margin_s']:g} s offer margin)."
    ]
    out.append(f"- threshold: {rc['why_threshold']}.")
    out.append(
        f"- TTL: {rc['why_ttl']} ({_v(rc['best'][metric])} {unit} at TTL {rc['best']['ttl_s']:g} s); this "
        f"setting: {_v(row[metric])} {unit}, {row['gib_s_held']:,.2f} GiB·s held, peak "
        f"{row['peak_gib_held']:,.3f} GiB on one D{_share(rec, rc['peak_bytes'])}, {rc['failures']} predicted "
        "failed requests."
    )
    if recd is not None:
        out.append(
            f"- recorded (TTL {_ttl_text(rec, recd['ttl_s'])}, threshold {recd['threshold']}): "
            f"{_v(recd[metric])} {unit}, "
            f"{recd['gib_s_held']:,.2f} GiB·s, peak {recd['peak_gib_held']:,.3f} GiB, "
            f"{recd['pulled']:,} pulled / {recd['decisions']:,} decisions."
        )
    rate = cal.prefill_tokens_per_ms.get(None)
    out.append(
        f"- calibration (from the traces only): prefill {_v(rate and rate * 1000 / rec.time_scale)} tokens/model s "
        f"from {cal.prefill_requests.get(None, 0):,} {sc.SPAN_ENGINE_PREFILL} spans; d2p transfer "
        f"{_v(cal.xfer_overhead_ms.get(None))} ms + {_v(cal.xfer_ms_per_token.get(None), 5)} ms/token (wall), "
        f"{_v(cal.bytes_per_ms and cal.bytes_per_ms / 1e6, 2)} GB/s, from {cal.transfers.get(None, 0):,} "
        f"{sc.SPAN_KV_TRANSFER} spans; gaps from {cal.samples.get(sc.SPAN_KV_RETENTION, 0):,} "
        f"{sc.SPAN_KV_RETENTION} and {rec.decisions:,} {sc.SPAN_KV_DECISION} spans; TTFT from "
        f"{cal.samples.get(sc.SPAN_PROXY_REQUEST, 0):,} {sc.SPAN_PROXY_REQUEST} spans."
    )
    if not rec.offer_margin_known:
        out.append(
            "- the traces do not record the proxy's --conversation-ttl: offer margin assumed "
            f"{rec.offer_margin_s:g} s (pass --offer-margin)."
        )
    return out


def _ttl_text(rec: Recorded, ttl_s: float | None) -> str:
    if ttl_s is not None:
        return f"{ttl_s:g} s"
    return "each D its own: " + ", ".join(f"{t:g}" for t in rec.ttls) + " s"


def _v(value, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:,.{digits}f}"


def _share(rec: Recorded, peaks: dict) -> str:
    shares = [peaks[e] / rec.pool_bytes[e] for e in peaks if rec.pool_bytes.get(e)]
    return f" ({max(shares):.1%} of its KV pool)" if shares else ""
