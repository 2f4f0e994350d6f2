"""float64 inputs over the whole float64 range (1e-320 .. 1e308, mixed signs, subnormals): both backends' moments
against an exact oracle (Python fractions on the values: the mean and M2 as exact rationals, rounded once to
float64; NumPy's own std overflows past ~1.3e154), within a tensor longer than a kernel block and merged across
calls. M2 past float64's range is inf (std and var then inf), never 0 or NaN."""
import math
import sys
from fractions import Fraction

import numpy as np
import pytest
import torch

from hookstats import StatsConfig, accumulate, layout, rawstate, reference

CFG = StatsConfig()
ON = torch.tensor([True])
DBL_MAX = sys.float_info.max
OPS = {"reference": reference.accumulate_}
if accumulate.backend() == "compiled":
    OPS["compiled"] = torch.ops.hookstats.accumulate_.default


def fresh():
    f = rawstate.empty()
    return f, torch.zeros(CFG.istate_size, dtype=torch.int64), torch.zeros(0, dtype=torch.uint8)


def exact(values):
    """(n, mean, M2) of the finite values, exact, each rounded once to float64 (inf past its range)."""
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
    "pair_1e155_and_3": lambda rng: np.array([1e155, -1e155, 3.0]),
    "near_max_mixed": lambda rng: np.array([DBL_MAX, -DBL_MAX, DBL_MAX / 3, 1.0]),
    "near_max_same_sign": lambda rng: np.full(3000, 1.7e308) - rng.uniform(0, 1e300, 3000),
    "huge_mixed_long": lambda rng: magnitudes(rng, 5000, 150, 308),
    "whole_range_mixed": lambda rng: magnitudes(rng, 4000, -320, 308),
    "huge_with_nonfinite": lambda rng: np.concatenate([magnitudes(rng, 2500, 200, 300), [np.nan, np.inf, -np.inf]]),
    "moderate_spread_1e153": lambda rng: 1e153 * (1 + rng.standard_normal(3000)),
    "tiny_normal": lambda rng: magnitudes(rng, 3000, -307, -150),
    "subnormals": lambda rng: magnitudes(rng, 3000, -323, -308),
    "ordinary": lambda rng: rng.standard_normal(3000) * 3 + 1,
}


@pytest.mark.parametrize("backend", list(OPS))
@pytest.mark.parametrize("case", list(CASES))
def test_float64_moments_over_the_whole_range(backend, case):
    rng = np.random.default_rng(sorted(CASES).index(case))
    v = CASES[case](rng)
    op = OPS[backend]
    f, i, s = fresh()
    op(torch.from_numpy(v), f, i, s, ON, *CFG.op_args())
    assert_moments(f.tolist(), v.tolist())
    # the same values over three calls (a merge across calls), one of them non-contiguous
    f, i, s = fresh()
    parts = np.array_split(v, 3)
    for k, p in enumerate(parts):
        t = torch.from_numpy(p)
        if k == 1 and len(p) > 1:
            t = torch.from_numpy(np.repeat(p, 2))[::2]
        op(t, f, i, s, ON, *CFG.op_args())
    assert_moments(f.tolist(), v.tolist())


@pytest.mark.parametrize("backend", list(OPS))
def test_the_pair_reads_as_spread_not_constant(backend):
    f, i, s = fresh()
    OPS[backend](torch.tensor([1e200, -1e200], dtype=torch.float64), f, i, s, ON, *CFG.op_args())
    from hookstats.records import finalize
    rec = finalize(f.numpy(), i.numpy(), CFG)
    assert rec["std"] == pytest.approx(math.sqrt(2) * 1e200, rel=1e-12)


def test_both_backends_agree_bit_for_bit_where_no_scaling_is_needed():
    if "compiled" not in OPS:
        pytest.skip("the compiled op is not built")
    v = torch.from_numpy(np.random.default_rng(3).standard_normal(5000) * 1e100)
    out = []
    for op in OPS.values():
        f, i, s = fresh()
        op(v, f, i, s, ON, *CFG.op_args())
        out.append(f)
    assert out[0][layout.M2] == pytest.approx(out[1][layout.M2].item(), rel=1e-12)
