"""float64 values over the whole float64 range (1e-320 .. 1e308, mixed signs, subnormals) and their exact moments:
Python fractions on the values, the mean and M2 each rounded once to float64 (+inf past its range). NumPy's own
std overflows past ~1.3e154, so it cannot be the oracle there. The op keeps M2 in float64: where the true M2
passes DBL_MAX it must read +inf (std and var then read NaN with moments_overflow), never 0 or NaN; everything representable must match."""
import math
import sys
from fractions import Fraction

import numpy as np
import pytest

from hookstats import layout

DBL_MAX = sys.float_info.max


def exact(values):
    """(n, mean, M2) of the finite values, exact, each rounded once to float64 (inf past its range), and them."""
    fin = [Fraction(v) for v in values if math.isfinite(v)]
    n = len(fin)
    mean = sum(fin) / n
    m2 = sum((v - mean) ** 2 for v in fin)

    def rounded(q):
        try:
            return float(q)
        except OverflowError:
            return math.inf
    return n, rounded(mean), rounded(m2), fin


def assert_moments(f, values):
    """f (fstate as a list) holds the exact moments, min and max of the values."""
    n, mean, m2, fin = exact(values)
    big = float(max(abs(v) for v in fin))
    eps = np.finfo(np.float64).eps
    assert f[layout.N_FINITE] == n
    # the mean: to a few roundings per value of the largest magnitude (what scaling by it keeps)
    assert abs(f[layout.MEAN] - mean) <= 4 * n * eps * big + 5e-324, (f[layout.MEAN], mean)
    got = f[layout.M2]
    if m2 == math.inf:
        assert got == math.inf, got
    elif m2 > DBL_MAX / 4:  # the Chan merge's d * d may overflow this close to the edge
        assert got == math.inf or got == pytest.approx(m2, rel=1e-9)
    else:
        # subnormal squares lose bits: up to one subnormal ulp per value
        assert math.isfinite(got) and abs(got - m2) <= 1e-9 * m2 + 4 * n * 5e-324, (got, m2)
    assert (f[layout.MIN], f[layout.MAX]) == (min(fin), max(fin))


def magnitudes(rng, n, lo_exp, hi_exp, signs=True):
    e = rng.uniform(lo_exp, hi_exp, n)
    v = np.exp(e * np.log(10.0))
    v = np.where(np.isfinite(v), v, DBL_MAX)
    return v * (rng.choice([-1.0, 1.0], n) if signs else 1.0)


CASES = {
    "pair_1e200": lambda rng: np.array([1e200, -1e200]),
    # few values: the block's shifted sums overflow to inf - inf (once clamped to an M2 of 0)
    "three_1e200": lambda rng: np.array([1e200, -1e200, 3e199]),
    "four_2e300": lambda rng: np.array([2e300, -2e300, 1.5e300, 1e300]),
    "pair_1e155_and_3": lambda rng: np.array([1e155, -1e155, 3.0]),
    "near_max_mixed": lambda rng: np.array([DBL_MAX, -DBL_MAX, DBL_MAX / 3, 1.0]),
    "near_max_same_sign": lambda rng: np.full(3000, 1.7e308) - rng.uniform(0, 1e300, 3000),
    # runs of opposite signs near DBL_MAX: block (and call) means whose difference overflows; the mean is ~0
    "near_max_opposite_runs": lambda rng: np.concatenate([np.full(700, 0.9 * DBL_MAX), np.full(700, -0.9 * DBL_MAX)]),
    # sums overflow, M2 is exactly 0
    "near_max_constant": lambda rng: np.full(1000, 1.5e308),
    "huge_mixed_long": lambda rng: magnitudes(rng, 5000, 150, 308),
    "whole_range_mixed": lambda rng: magnitudes(rng, 4000, -320, 308),
    "huge_with_nonfinite": lambda rng: np.concatenate([magnitudes(rng, 2500, 200, 300), [np.nan, np.inf, -np.inf]]),
    "moderate_spread_1e153": lambda rng: 1e153 * (1 + rng.standard_normal(3000)),
    # values past 1.3e154 (their squares overflow) whose M2 fits: exact
    "huge_values_fitting_m2": lambda rng: 1e155 + 1e150 * rng.standard_normal(3000),
    "one_huge_among_tiny": lambda rng: np.concatenate([[5e153], magnitudes(rng, 99, -320, -200)]),
    "tiny_normal": lambda rng: magnitudes(rng, 3000, -307, -150),
    "subnormals": lambda rng: magnitudes(rng, 3000, -323, -308),
    "ordinary": lambda rng: rng.standard_normal(3000) * 3 + 1,
}


def case_values(case):
    return CASES[case](np.random.default_rng(sorted(CASES).index(case)))
