"""float64 inputs over the whole float64 range (1e-320 .. 1e308, mixed signs, subnormals): both backends' moments
against an exact oracle (float64_exact: Python fractions), within a tensor longer than a kernel block and merged
across calls. M2 is kept in float64: past its range it is +inf (std and var then inf), never 0 or NaN."""
import math

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


@pytest.mark.parametrize("backend", list(OPS))
def test_the_pair_reads_as_spread_not_constant(backend):
    """[1e200, -1e200]: M2 = 2e400 passes float64's range, so std and var read inf (they once read 0)."""
    f, i, s = fresh()
    OPS[backend](torch.tensor([1e200, -1e200], dtype=torch.float64), f, i, s, ON, CFG.op_params())
    rec = finalize(f.numpy(), i.numpy(), CFG)
    assert rec["std"] == math.inf and rec["var"] == math.inf
    assert (rec["mean"], rec["min"], rec["max"]) == (0.0, -1e200, 1e200)


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
