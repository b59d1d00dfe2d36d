"""The calibration's least squares (kvtrace.analysis.fitting): a term the data would make negative is
held at 0, and so is one that does not reduce the residual beyond its price (AICc, pinned on
hand-computed cases)."""

from __future__ import annotations

import numpy as np
import pytest

from kvtrace.analysis import fitting


def test_a_term_the_data_would_make_negative_is_held_at_zero():
    x = np.column_stack([np.ones(5), np.arange(5.0)])
    y = 3.0 - 0.5 * np.arange(5.0)  # falls with x: the slope would be negative
    coef, zero = fitting.nonneg_lstsq(x, y, ("fixed_s", "per_x_s"))
    assert zero == ("per_x_s",)
    assert coef == pytest.approx([y.mean(), 0.0])


def test_the_information_criterion_is_aicc():
    # n ln(SS / n) + 2k + 2k(k + 1) / (n - k - 1), SS at least the floor, infinite without a spare sample
    assert fitting.aicc(6.0, 6, 1, 0.0) == pytest.approx(0.0 + 2 + 4 / 4)
    assert fitting.aicc(6.0 / np.e, 6, 2, 0.0) == pytest.approx(-6.0 + 4 + 12 / 3)
    assert fitting.aicc(1e-30, 6, 2, 6.0) == pytest.approx(0.0 + 4 + 12 / 3)
    assert fitting.aicc(1.0, 3, 2, 0.0) == float("inf")


# orthogonal columns: y = 10 * ones + d * alt + r (r orthogonal to both, |r|^2 = 4), so the fit of
# ones alone leaves SS = 6 d^2 + 4, both together SS = 4; AICc keeps alt where 6 ln(SS1 / SS2) > 8 - 3,
# i.e. SS1 / SS2 > e^(5/6) = 2.30
ONES, ALT, REST = np.ones(6), np.array([1.0, -1, 1, -1, 1, -1]), np.array([1.0, 1, -1, -1, 0, 0])


@pytest.mark.parametrize(
    "d, coef, zero",
    [(2.0, [10.0, 2.0], ()), (1.0, [10.0, 1.0], ()), (0.5, [10.0, 0.0], ("per_alt_s",))],
    ids=["ratio-7-kept", "ratio-2.5-kept", "ratio-1.375-held-at-0"],
)
def test_a_term_that_does_not_reduce_the_residual_beyond_its_price_is_held_at_zero(d, coef, zero):
    x = np.column_stack([ONES, ALT])
    got, held = fitting.nonneg_lstsq(x, 10 * ONES + d * ALT + REST, ("fixed_s", "per_alt_s"))
    assert held == zero
    assert got == pytest.approx(coef)
