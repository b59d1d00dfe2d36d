"""Least squares for the calibration (:mod:`kvtrace.analysis.calibrate`): non-negative fits that
keep only the terms their samples support (the smallest AICc over subsets of the terms), with
outliers left out of a second fit, and :class:`Fit`, what one fit reports."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

OUTLIER_MADS = 4.0  # a sample this many robust deviations off the first fit is left out of the second
OUTLIER_FLOOR = 0.05  # ... and more than this share of the median sample off
EXACT = 1e-9  # a residual below this share of the largest sample is rounding (every such fit is exact)


class CalibrationError(ValueError):
    """The traces cannot be calibrated (one line: what is missing)."""


@dataclass
class Fit:
    """One least-squares fit: ``terms`` (name -> coefficient, model seconds per unit), the spans and
    samples behind it, the residual (RMS, model ms) and the mean of what was fitted (model ms)."""

    name: str
    terms: dict
    spans: dict  # span name -> spans used
    samples: int
    residual_ms: float
    mean_ms: float
    held_at_zero: tuple = ()  # terms the data made negative or do not support, held at 0
    outliers: int = 0  # samples left out of the refit (residual beyond OUTLIER_MADS)
    range: tuple = ()  # prefill: the fewest and most new tokens of a sample

    def value(self, term: str) -> float:
        return float(self.terms[term])


def nonneg_lstsq(x: np.ndarray, y: np.ndarray, names: tuple[str, ...]) -> tuple[np.ndarray, tuple]:
    """Least squares ``x @ b ~ y`` with ``b >= 0`` and only the terms the data support: over the
    subsets of columns whose unconstrained solution is non-negative (the others held at 0), the one
    with the smallest information criterion (:func:`aicc`: the residual, plus a price per term that
    grows as the samples per term fall); (coefficients, names held at 0).  A subset whose columns
    are not independent is skipped.

    Why not the smallest residual: samples that span a narrow range (a run whose prompts are all
    about 12,000 tokens) let a fixed cost trade off against a per-token one for a sliver of
    residual; the fit that explains them with one term instead of two then prices a 200-token
    prefill as what the data say (per token), not as most of a 12,000-token one."""
    n, k = x.shape
    floor = n * (EXACT * float(np.abs(y).max(initial=0.0))) ** 2 or np.finfo(float).tiny
    best, best_score = None, math.inf
    for size in range(k, 0, -1):
        for cols in itertools.combinations(range(k), size):
            sub = x[:, cols]
            if np.linalg.matrix_rank(sub) < size:
                continue
            coef, *_ = np.linalg.lstsq(sub, y, rcond=None)
            if (coef < 0).any():
                continue
            score = aicc(float(((sub @ coef - y) ** 2).sum()), n, int((coef > 0).sum()), floor)
            if best is None or score < best_score - 1e-9:  # a tie keeps the larger subset (tried first)
                full = np.zeros(k)
                full[list(cols)] = coef
                best, best_score = full, score
    if best is None:
        return np.zeros(k), names
    return best, tuple(n for n, b in zip(names, best, strict=True) if b == 0)


def aicc(ss: float, n: int, terms: int, floor: float) -> float:
    """Akaike's information criterion with the small-sample correction (AICc) of a least-squares
    fit of ``n`` samples with ``terms`` coefficients and residual sum of squares ``ss``:
    ``n ln(SS / n) + 2 k + 2 k (k + 1) / (n - k - 1)`` (infinite when ``n <= k + 1``: no sample is
    left to judge the last term by).  ``ss`` counts as at least ``floor``: a fit exact but for
    rounding is no better than another exact one, so the one with fewer terms wins."""
    if n <= terms + 1:
        return math.inf
    return n * math.log(max(ss, floor) / n) + 2 * terms + 2 * terms * (terms + 1) / (n - terms - 1)


def least_squares(name: str, x: np.ndarray, y_s: np.ndarray, names: tuple[str, ...], spans: dict) -> Fit:
    need = len(names) + 1
    if len(y_s) < need:
        have = ", ".join(f"{n} {s}" for s, n in spans.items())
        raise CalibrationError(
            f"too few samples for the {name} fit: {len(y_s)} ({have}); it needs at least {need} "
            "(record more requests, or a run where this work happened)"
        )
    coef, zero = nonneg_lstsq(x, y_s, names)
    keep = _inliers(x @ coef - y_s, y_s)
    if keep.sum() >= need and not keep.all():  # a span delayed by something else (a busy host): refit without
        coef, zero = nonneg_lstsq(x[keep], y_s[keep], names)
    resid = x[keep] @ coef - y_s[keep]
    return Fit(
        name,
        {n: float(c) for n, c in zip(names, coef, strict=True)},
        spans,
        int(keep.sum()),
        float(np.sqrt((resid**2).mean()) * 1e3),
        float(y_s[keep].mean() * 1e3),
        zero,
        int((~keep).sum()),
    )


def _inliers(resid: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Samples whose residual is within :data:`OUTLIER_MADS` scaled median absolute deviations of
    the median, or within :data:`OUTLIER_FLOOR` of the median sample (a fit that is exact but for
    rounding has none)."""
    dev = np.abs(resid - np.median(resid))
    limit = max(OUTLIER_MADS * 1.4826 * float(np.median(dev)), OUTLIER_FLOOR * float(np.median(np.abs(y))))
    return dev <= limit
