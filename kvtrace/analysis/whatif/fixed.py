"""What every setting of the what-if grid shares, computed once per :class:`.data.Recorded`
(:class:`_Fixed`, cached on the recording by :func:`_fixed`), and the caches of what one TTL or one
threshold determines.

A module of its own so that :mod:`.replay` keeps the per-setting replay, the grid and the
recommendation, and this one the precomputation those settings read (decision counts and TTFTs
by outcome, retention ends and where they fall among their D's starts).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from kvtrace import kvrules
from kvtrace.analysis.whatif.arrays import FATE_READ, FATE_RELEASED, FATE_UNCONSUMED
from kvtrace.analysis.whatif.data import Recorded


class _Fixed:
    """What every setting shares, computed once per :class:`Recorded`, and caches of what one TTL
    or one threshold determines (the grid's 8 TTLs x 6 thresholds need 8 + 6 of those).

    A decision ends up pulled, failed, expired or otherwise (not pulled); its TTFT in each case
    does not depend on the setting (:attr:`ttft`).  A retention ends up read, released or
    unconsumed; under one TTL its end in each case is fixed, so its GiB·s (bytes x time held)
    and where its end falls among its D's starts (for the peak) are too (:meth:`ttl`)."""

    def __init__(self, rec: Recorded) -> None:
        pulled_rec = rec.d_code == kvrules.PULLED
        self.count = kvrules.pull_count(rec.d_remote, rec.d_prompt, rec.d_local)
        # verify=enforce: at most the verified prefix (kvrules.verified_count); elsewhere no limit
        self.vcount = np.where(
            rec.d_enforce, kvrules.verified_count(rec.d_verified, rec.d_prompt, rec.d_local), self.count
        )
        xfer_pulled = np.where(pulled_rec, rec.d_xfer_ms, rec.d_xfer_a + rec.d_xfer_b * self.count)
        self.has_next = rec.r_next >= 0
        self.at = np.where(self.has_next, rec.r_next, 0)
        self.t_dec = rec.d_start_ns[self.at]
        self.read_end = self.t_dec + (xfer_pulled[self.at] * 1e6).astype(np.int64)
        # where each candidate end falls among its D's starts (:func:`_first_start_at`; monotone
        # in the time, so it commutes with the min / max / where that pick the end), in threads
        with ThreadPoolExecutor(2) as pool:
            places = pool.map(
                lambda t: _first_start_at(rec, t), (rec.r_start_ns, rec.r_end_ns, self.read_end, self.t_dec)
            )
            self._decisions(rec, pulled_rec, xfer_pulled)
            self.k_start, self.k_rec_end, self.k_read_end, self.k_t_dec = places
        self.same_read, self.same_released, self.same_unconsumed = (
            rec.r_fate == f for f in (FATE_READ, FATE_RELEASED, FATE_UNCONSUMED)
        )
        self.n_r, self.r_index = rec.retentions, np.arange(rec.retentions, dtype=np.intp)
        self.cum_bytes = [np.cumsum(rec.r_bytes[part]) for part in rec.r_by_engine]
        self.bytes_f = rec.r_bytes.astype(float)
        self.ttls: dict = {}
        self.thresholds: dict = {}

    def _decisions(self, rec: Recorded, pulled_rec: np.ndarray, xfer_pulled: np.ndarray) -> None:
        self.pull_amount = np.where(pulled_rec, rec.d_pulled, np.minimum(self.count, self.vcount))  # what a pull moves
        missing = rec.d_prompt - rec.d_local
        self.failed_rec = rec.d_code == kvrules.FAILED
        per_token_ms = np.where(np.isnan(rec.d_rate), 0.0, 1.0 / rec.d_rate)
        self.recomputed_pulled = np.maximum(missing - self.pull_amount, 0)
        self.recomputed_not = np.maximum(missing, 0)
        self.extra_recomputed = self.recomputed_not - self.recomputed_pulled  # what not pulling adds
        self.recomputed_if_all_pulled = int(self.recomputed_pulled.sum())

        def ttft(recomputed, xfer, lost):
            # recorded TTFT + the change; 0 at the recorded setting, so that row is the recorded TTFT exactly
            out = rec.d_ttft_ms + ((recomputed - rec.d_recomputed) * per_token_ms + (xfer - rec.d_xfer_ms))
            return np.where(lost & rec.d_fail_policy, np.nan, out) * rec.time_scale

        # TTFT (model ms; NaN: unknown, or the request fails) by outcome: FAILED, EXPIRED, PULLED, other
        self.ttft = np.concatenate(
            [
                ttft(self.recomputed_not, rec.d_xfer_ms, True),
                ttft(self.recomputed_not, 0.0, True),
                ttft(self.recomputed_pulled, xfer_pulled, False),
                ttft(self.recomputed_not, 0.0, False),
            ]
        )
        n = rec.decisions
        self.ttft_at = np.full(len(kvrules.CODE), 3 * n, dtype=np.intp)  # outcome code -> offset in ttft
        self.ttft_at[[kvrules.FAILED, kvrules.EXPIRED, kvrules.PULLED]] = [0, n, 2 * n]
        self.d_index = np.arange(n, dtype=np.intp)
        # expiry time left at the recorded TTL (vLLM's measure when recorded); + (T - recorded T) at T
        self.left = np.where(np.isnan(rec.d_remaining_s), rec.d_ttl_s - rec.d_gap_s, rec.d_remaining_s)

    def ttl(self, rec: Recorded, ttl_s: float | None, margin: float) -> dict:
        """What one TTL decides (``None``: every D its recorded TTL)."""
        key = (ttl_s, margin)
        if key not in self.ttls:
            # the proxy's limit, written so that the recorded setting gives the recorded limit exactly
            limit = rec.offer_ttl_s + (0.0 if ttl_s is None else ttl_s - rec.ttl_s) + (rec.offer_margin_s - margin)
            offered = rec.d_has_entry & kvrules.entry_offered(rec.d_age_s, limit)
            d_ttl, r_ttl = (rec.d_ttl_s, rec.r_ttl_s) if ttl_s is None else (ttl_s, np.float64(ttl_s))
            ttl_ns = np.round(r_ttl / rec.time_scale * 1e9).astype(np.int64)
            held, k_end = self.ends(rec, np.minimum(rec.r_start_ns + ttl_ns, rec.window_end_ns), r_ttl == rec.r_ttl_s)
            self.ttls[key] = {
                "offered": offered,
                "declined": kvrules.read_declined(self.left + (d_ttl - rec.d_ttl_s)),
                "off_at": self.has_next & offered[self.at],
                "held": held,
                "k_end": k_end,
            }
        return self.ttls[key]

    def ends(self, rec: Recorded, expiry: np.ndarray, same_ttl: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A retention's end when read, released or unconsumed (one after the other in the arrays
        returned): held until the session's next decision reads it (+ the transfer) or releases
        it, at most until it ``expiry``; the recorded end where the fate is the recorded one
        (unconsumed: at the recorded TTL, ``same_ttl``).  Returned as bytes x ns held, and as the
        index of the first start at or after the end (int32)."""
        n, start = rec.retentions, rec.r_start_ns
        k_exp = _first_start_at(rec, expiry)
        held, k_end = np.empty(3 * n), np.empty(3 * n, dtype=np.int32)
        cases = (
            (self.read_end, self.k_read_end, self.same_read),
            (self.t_dec, self.k_t_dec, self.same_released),
            (None, None, self.same_unconsumed & same_ttl),
        )
        for i, (end, k, same) in enumerate(cases):
            e = np.minimum(end, expiry) if end is not None else expiry.copy()
            np.copyto(e, rec.r_end_ns, where=same)
            np.maximum(e, start, out=e)
            np.subtract(e, start, out=e)
            np.multiply(self.bytes_f, e, out=held[i * n : (i + 1) * n])
            ke = np.minimum(k, k_exp) if k is not None else k_exp.copy()
            np.copyto(ke, self.k_rec_end, where=same)
            np.maximum(ke, self.k_start, out=k_end[i * n : (i + 1) * n], casting="unsafe")
        return held, k_end

    def threshold(self, rec: Recorded, threshold: int) -> np.ndarray:
        if threshold not in self.thresholds:
            code = kvrules.d2p_outcome(True, self.count, rec.d_local, threshold)
            self.thresholds[threshold] = kvrules.enforced_outcome(code, self.count, self.vcount, threshold)
        return self.thresholds[threshold]


def _fixed(rec: Recorded) -> _Fixed:
    if getattr(rec, "_fixed", None) is None:
        rec._fixed = _Fixed(rec)
    return rec._fixed


def _first_start_at(rec: Recorded, times: np.ndarray) -> np.ndarray:
    """Per retention: the index (within its D engine's retentions, sorted by start) of the first
    one starting at or after ``times``; an interval ending at ``times`` no longer counts there."""
    out = np.empty(len(times), dtype=np.int64)
    for part in rec.r_by_engine:
        out[part] = np.searchsorted(rec.r_start_ns[part], times[part], side="left")
    return out
