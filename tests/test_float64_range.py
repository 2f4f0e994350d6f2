"""float64 inputs over the whole float64 range (1e-320 .. 1e308, mixed signs, subnormals): both backends' moments
against an exact oracle (float64_exact: Python fractions), within a tensor longer than a kernel block and merged
across calls. M2 is kept in float64: past its range it is +inf, and var, std, rms and l2 read NaN with
moments_overflow 1, never 0 or inf."""
import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from float64_exact import CASES, assert_moments, case_values, exact
from hookstats import StatsConfig, accumulate, layout, rawstate, reference
from hookstats.records import finalize

CFG = StatsConfig()
ON = torch.tensor([True])
OPS = {"reference": reference.accumulate_}
if accumulate.backend() == "compiled":
    OPS["compiled"] = torch.ops.hookstats.accumulate_.default


def fresh():
    f = rawstate.empty()
    return f, torch.zeros(CFG.istate_size, dtype=torch.int64), torch.zeros(0, dtype=torch.uint8)


@pytest.mark.parametrize("backend", list(OPS))
@pytest.mark.parametrize("case", list(CASES))
def test_float64_moments_over_the_whole_range(backend, case):
    v = case_values(case)
    op = OPS[backend]
    f, i, s = fresh()
    op(torch.from_numpy(v), f, i, s, ON, CFG.op_params())
    assert_moments(f.tolist(), v.tolist())
    # the same values over three calls (a merge across calls), one of them non-contiguous
    f, i, s = fresh()
    parts = np.array_split(v, 3)
    for k, p in enumerate(parts):
        t = torch.from_numpy(p)
        if k == 1 and len(p) > 1:
            t = torch.from_numpy(np.repeat(p, 2))[::2]
        op(t, f, i, s, ON, CFG.op_params())
    assert_moments(f.tolist(), v.tolist())


SPREAD_PAST_M2 = {
    "pair": [1e200, -1e200],
    "three": [1e200, -1e200, 3e199],
    "four_near_1e200": [1e200, 1.1e200, 0.9e200, 1.05e200],
    "near_2e300": [2e300, -2e300, 1.5e300, 1e300],
}


@pytest.mark.parametrize("backend", list(OPS))
@pytest.mark.parametrize("case", list(SPREAD_PAST_M2))
def test_an_m2_past_float64_reads_nan_with_its_reason_never_0_or_inf(backend, case):
    """M2 passes float64's range while std is finite (~1e200): var, std, rms and l2 read NaN, moments_overflow 1
    (they once read 0 on the compiled op, and inf from the reference); mean, min and max stay exact."""
    v = SPREAD_PAST_M2[case]
    f, i, s = fresh()
    OPS[backend](torch.tensor(v, dtype=torch.float64), f, i, s, ON, CFG.op_params())
    assert f[layout.M2] == math.inf  # raw state: M2 rounded to float64 is inf
    rec = finalize(f.numpy(), i.numpy(), CFG)
    assert rec["moments_overflow"] == 1
    for name in ("var", "std", "rms", "l2"):
        assert math.isnan(rec[name]), (name, rec[name])
    n, mean, _, _ = exact(v)
    assert rec["mean"] == pytest.approx(mean, rel=1e-15)
    assert (rec["min"], rec["max"]) == (min(v), max(v))


@pytest.mark.parametrize("backend", list(OPS))
@pytest.mark.parametrize("center", [1.5e300, -1.5e300, 1e155])
def test_rms_and_l2_of_huge_values_with_a_fitting_m2_are_finite_and_exact(backend, center):
    """mean^2 passes float64's range, M2 does not: rms and l2 equal the exact ones (they once read inf). Near
    1.5e300 any spread of distinct float64 values squares past the range: equal values there."""
    v = [center * (1 + k * 1e-6) if abs(center) < 1e200 else center for k in range(4)]
    f, i, s = fresh()
    OPS[backend](torch.tensor(v, dtype=torch.float64), f, i, s, ON, CFG.op_params())
    rec = finalize(f.numpy(), i.numpy(), CFG)
    fr = [Fraction(x) for x in v]
    ms = sum(x * x for x in fr) / len(fr)
    rms = math.sqrt(float(ms / Fraction(center) ** 2)) * abs(center)
    assert rec["moments_overflow"] == 0
    assert rec["rms"] == pytest.approx(rms, rel=1e-12)
    assert rec["l2"] == pytest.approx(rms * 2.0, rel=1e-12)
    assert math.isfinite(rec["std"])


def test_a_monitor_names_the_overflow_in_stats_and_history():
    """End to end: attach, a float64 output whose M2 passes float64's range, stats() and the history agree."""
    import hookstats
    m = torch.nn.Identity()
    mon = hookstats.attach(m, include_paramless=True, history=True)
    m(torch.tensor([1e200, -1e200, 3e199], dtype=torch.float64))
    mon.step()
    m(torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64))
    mon.step()
    rec = mon.stats()["Identity:output"]
    assert rec["moments_overflow"] == 1 and math.isnan(rec["std"])
    df = mon.history()
    val = {(r.step, r.stat): r.value for r in df[df.target == "Identity:output"].itertuples()}
    assert val[0, "moments_overflow"] == 1 and math.isnan(val[0, "std"])
    assert val[1, "moments_overflow"] == 0 and val[1, "std"] == pytest.approx(np.std([1.0, 2.0, 4.0], ddof=1))
    mon.remove()


@pytest.mark.parametrize("backend", list(OPS))
@pytest.mark.parametrize("offset", [0.0, 1e155])
def test_huge_spread_with_a_fitting_m2_is_exact(backend, offset):
    """A spread of 1e150 (and values near 1e155, whose squares pass float64's range) whose M2 fits: std, var and
    mean to the exact oracle's."""
    v = offset + 1e150 * np.random.default_rng(5).standard_normal(2000)
    f, i, s = fresh()
    OPS[backend](torch.from_numpy(v), f, i, s, ON, CFG.op_params())
    n, mean, m2, _ = exact(v.tolist())
    rec = finalize(f.numpy(), i.numpy(), CFG)
    assert rec["std"] == pytest.approx(math.sqrt(m2 / (n - 1)), rel=1e-9)
    assert rec["var"] == pytest.approx(m2 / (n - 1), rel=1e-9)
    assert rec["mean"] == pytest.approx(mean, rel=1e-12, abs=1e138)


@pytest.mark.parametrize("backend", list(OPS))
def test_a_far_value_merged_into_many(backend):
    """One value 1e153 away from 2000 earlier ones: d * d * n_a overflows float64 where the merged M2 fits."""
    v = np.random.default_rng(1).standard_normal(2000)
    f, i, s = fresh()
    OPS[backend](torch.from_numpy(v), f, i, s, ON, CFG.op_params())
    OPS[backend](torch.tensor([1.3e153], dtype=torch.float64), f, i, s, ON, CFG.op_params())
    assert_moments(f.tolist(), v.tolist() + [1.3e153])


def test_both_backends_agree_bit_for_bit_where_no_scaling_is_needed():
    if "compiled" not in OPS:
        pytest.skip("the compiled op is not built")
    v = torch.from_numpy(np.random.default_rng(3).standard_normal(5000) * 1e100)
    out = []
    for op in OPS.values():
        f, i, s = fresh()
        op(v, f, i, s, ON, CFG.op_params())
        out.append(f)
    assert out[0][layout.M2] == pytest.approx(out[1][layout.M2].item(), rel=1e-12)
