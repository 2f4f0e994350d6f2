"""Float buckets (flag FLOAT_HIST) of the op, compiled kernels and reference, against a NumPy oracle that reads each
value's bucket from its exact magnitude (float_oracle.float_buckets), and the rest of the state against helpers.oracle."""
import math

import numpy as np
import pytest
import torch
from conftest import DTYPES
from float_oracle import float_buckets
from helpers import CPU_KERNELS, failure_with_kernel, no_host_sync, on_thread_counts, oracle
from test_accumulate import LAYOUTS, assert_matches

from hookstats import layout, rawstate, reference
from hookstats.config import StatsConfig

ON = torch.tensor([True])
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                                        "ignore:invalid value encountered:RuntimeWarning")
# the configs here describe the other slots; state() adds the FLOAT_HIST flag to the op's flags itself
FLOAT_ONLY = StatsConfig(linear_hist=False, log_hist=False, float_hist=False)
F32_MAX = float(np.finfo(np.float32).max)
below = lambda v: float(np.nextafter(v, 0.0))  # noqa: E731  the float64 just below v in magnitude

# Values on and around the edges of the buckets and of each dtype's range; converting to a narrower dtype rounds
# them (to inf, zero or a subnormal), and the oracle sees the converted values.
SPECIAL = [0.0, -0.0, math.nan, -math.nan, math.inf, -math.inf, 1.0, -1.0, 1.124, 1.125, -1.126, 3.0, 1e30, -1e30,
           65504.0, 2.0 ** -14, 2.0 ** -24, 6e-8, 1e-40, -1e-40, 2.0 ** -149, -(2.0 ** -149), 2.0 ** -126,
           2.0 ** -127, 3e38, -3.4e38, F32_MAX, 2.0 ** 127, 1e-5, -7.5e-3]
SPECIAL_F64 = [1e300, -1e300, 1e-300, -1e-300, 2.0 ** 128, -(2.0 ** 128), below(2.0 ** 128), -below(2.0 ** 128),
               below(2.0 ** -149), -below(2.0 ** -149), 2.0 ** -150, float(np.nextafter(F32_MAX, np.inf)),
               below(1.125), -below(1.125), below(2.0 ** -126), below(3 * 2.0 ** -129), 3 * 2.0 ** -129,
               5e-324, -5e-324, 1.7976931348623157e308, -1.7976931348623157e308, below(2.0 ** -148)]


def state(cfg=FLOAT_ONLY, flags=None):
    flags = cfg.flags | layout.FLOAT_HIST if flags is None else flags
    f = rawstate.empty()
    i = torch.zeros(layout.istate_size(cfg.nbins, flags), dtype=torch.int64)
    return f, i, torch.zeros(0, dtype=torch.uint8), layout.op_params(cfg.lo32, cfg.inv_w, cfg.eps32, cfg.nbins, flags)


def run(op, xs, cfg=FLOAT_ONLY, enabled=ON):
    f, i, s, args = state(cfg)
    for x in xs:
        op(x, f, i, s, enabled, args)
    return f.numpy(), i.numpy()


def make(kind, n, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64)
    if kind == "wide":  # every scale, past float32's in float64 (narrower dtypes: zeros, subnormals, +-inf)
        x = x * torch.exp2(torch.rand(n, generator=g, dtype=torch.float64) * 400 - 200)
    elif kind == "special":
        vals = torch.tensor(SPECIAL + (SPECIAL_F64 if dtype == torch.float64 else []), dtype=torch.float64)
        x = vals[torch.randint(0, len(vals), (n,), generator=g)]
    elif kind == "relu":
        x = torch.relu(x)
    elif kind == "zeros":
        x = torch.where(x > 0, 0.0, -0.0)
    return x.to(dtype)


def assert_state(got, x, cfg=FLOAT_ONLY, exact_floats=False, moments=True):
    """The float buckets exactly; count, near-zero, linear and log2 slots and min/max exactly; moments to the
    oracle's tolerances (tests/test_accumulate.py) where float64 holds them (1e300 squared does not)."""
    fg, ig = got
    base = layout.float_base(cfg.nbins, cfg.flags | layout.FLOAT_HIST)  # the op ran with FLOAT_HIST added
    buckets = ig[base:]
    np.testing.assert_array_equal(buckets, float_buckets(x), err_msg="float buckets differ")
    v = x.detach().double().numpy()
    assert buckets.sum() == v.size - np.isnan(v).sum() - np.isinf(v).sum()
    want = oracle(x, cfg)
    if moments and np.isfinite(want[0][layout.M2]):
        assert_matches((fg, ig[:base]), want, x.dtype, exact_floats=exact_floats)
    else:
        np.testing.assert_array_equal(ig[:base], want[1], err_msg="integer statistics differ")
        np.testing.assert_array_equal(fg[[layout.N_FINITE, layout.MIN, layout.MAX]],
                                      want[0][[layout.N_FINITE, layout.MIN, layout.MAX]])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
# The largest n: several parallel chunks of 2^15 values and a shorter last one (test_accumulate's oracle test says
# why no more); the 16-bit counters' flushes have test_millions_of_one_value_overflow_no_counter_at_any_thread_count.
@pytest.mark.parametrize("n", [0, 1, 7, 300, 4097, 3 * 2**15 + 2**14 + 3])
@pytest.mark.parametrize("kind", ["normal", "wide", "special", "relu", "zeros"])
def test_float_buckets_against_the_oracle(op, kind, n, dtype):
    x = make(kind, n, dtype, seed=n)
    assert_state(run(op, [x]), x, exact_floats=op is reference.accumulate_)


def test_the_oracle_puts_the_edge_values_in_their_buckets():
    """The oracle itself, on hand-made cases: a test of the definition, not of the code."""
    b = lambda v: int(np.flatnonzero(float_buckets(torch.tensor([v], dtype=torch.float64)))[0])  # noqa: E731
    assert b(1.0) == 127 * 8 and b(1.125) == 127 * 8 + 1 and b(below(1.125)) == 127 * 8
    assert b(-1.0) == layout.FLOAT_HALF + 127 * 8 and b(-0.0) == b(0.0) == layout.FLOAT_ZERO
    assert b(2.0 ** -149) == 0 and b(2.0 ** -129) == 1 and b(below(2.0 ** -126)) == 7 and b(2.0 ** -126) == 8
    assert b(below(2.0 ** -149)) == b(1e-300) == layout.FLOAT_BELOW and b(-1e-300) == 2 * layout.FLOAT_HALF - 3
    assert b(2.0 ** 128) == b(1e300) == layout.FLOAT_ABOVE and b(below(2.0 ** 128)) == 254 * 8 + 7
    assert b(F32_MAX) == 254 * 8 + 7 and b(-1e300) == layout.FLOAT_HALF + layout.FLOAT_ABOVE
    assert float_buckets(torch.tensor([math.nan, math.inf, -math.inf])).sum() == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_each_special_value_alone(op, dtype):
    """One call per value, each in a tensor of its own: a wrong bucket cannot hide among others. (Moments are
    tested elsewhere: the oracle's float64 mean of 300 equal values is not always exact.)"""
    vals = torch.tensor(SPECIAL + (SPECIAL_F64 if dtype == torch.float64 else []), dtype=torch.float64).to(dtype)
    for k in range(len(vals)):
        x = vals[k:k + 1].repeat(300)  # 300: the AVX2 kernel's blocks and the portable tail
        assert_state(run(op, [x]), x, moments=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout_name", list(LAYOUTS))
def test_non_contiguous_views(op, layout_name, dtype):
    x = LAYOUTS[layout_name](make("wide", 64 * 16 * 8 * 4, dtype, seed=5))
    assert_state(run(op, [x]), x, exact_floats=op is reference.accumulate_)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_small_tensors_one_after_another_each_exact(op, dtype):
    """Small tensors of unrelated ranges (a call reads and clears only the buckets its values' range touched),
    each into a state of its own: every state exact, none holding another's counts. Sizes around the AVX2 block
    and the largest range-flushed piece; both signs, each end of the range, zeros, NaN/Inf alone."""
    g = torch.Generator().manual_seed(7)
    scales = [1.0, 1e-3, 1e4, 1e-30, 1e30, 1e-41, 3e38, 1e-300, 1e300]
    tensors = []
    for k, n in enumerate([1, 2, 7, 63, 64, 65, 257, 1000, 4095, 4096, 4097, 9000]):
        x = torch.randn(n, generator=g, dtype=torch.float64) * scales[k % len(scales)]
        if k % 3 == 1:
            x = x.abs()
        elif k % 3 == 2:
            x = -x.abs()
        tensors.append(x)
    tensors += [torch.zeros(5, dtype=torch.float64), torch.tensor([math.nan, math.inf, -math.inf]),
                torch.tensor([-0.0, 1.5, math.nan]), torch.tensor([F32_MAX, -(2.0 ** -149)])]
    for x in tensors + tensors[::-1]:
        x = x.to(dtype)
        assert_state(run(op, [x]), x, moments=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_calls_merge_exactly(op, dtype):
    parts = [make(k, n, dtype, seed=n) for k, n in [("wide", 5000), ("special", 70001), ("relu", 1), ("normal", 4097),
                                                     ("zeros", 2 ** 15 + 1)]]
    assert_state(run(op, parts), torch.cat(parts), exact_floats=op is reference.accumulate_)


@pytest.mark.parametrize("flags", [f for f in range(16) if f & layout.FLOAT_HIST])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_every_flag_combination(op, flags, dtype):
    cfg = StatsConfig(linear_hist=bool(flags & layout.LINEAR_HIST), log_hist=bool(flags & layout.LOG_HIST),
                      near_zero="le" if flags & layout.SIGNED_NEAR_ZERO else "abs", eps=1e-3, float_hist=False,
                      **(dict(nbins=7, lo=-2, hi=5) if flags & layout.LINEAR_HIST else {}))
    x = make("special", 30011, dtype, seed=flags)
    assert_state(run(op, [x], cfg), x, cfg, exact_floats=op is reference.accumulate_)


def test_kernel_results_do_not_depend_on_the_thread_count():
    x = make("wide", 3 * 2 ** 15 + 300, torch.float32, seed=4)
    one, two = on_thread_counts(lambda: run(torch.ops.hookstats.accumulate_.default, [x]))
    np.testing.assert_array_equal(one[0], two[0])
    np.testing.assert_array_equal(one[1], two[1])
    assert_state(two, x)


@pytest.mark.parametrize("many", ["compiled", "reference"])
def test_accumulate_many(many):
    fn = torch.ops.hookstats.accumulate_many_.default if many == "compiled" else reference.accumulate_many_
    xs = [make("wide", n, dt, seed=n) for n, dt in [(3, torch.float32), (4097, torch.bfloat16), (70000, torch.float64),
                                                    (0, torch.float16), (999, torch.float16)]]
    states = [state() for _ in xs]
    fn(xs, [s[0] for s in states], [s[1] for s in states], [s[2] for s in states], ON, states[0][3])
    for x, (f, i, _, _) in zip(xs, states):
        assert_state((f.numpy(), i.numpy()), x, exact_floats=many == "reference")


def test_disabled_calls_leave_the_state_untouched(op):
    x = make("wide", 5000, torch.float32)
    f, i = run(op, [x, x * 3], enabled=torch.tensor([0], dtype=torch.int32))
    f0, i0, _, _ = state()
    np.testing.assert_array_equal(i, i0.numpy())
    np.testing.assert_array_equal(f, f0.numpy())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reference_counts_on_the_device_without_a_host_sync(dtype):
    """What the fallback runs on a GPU: index_add_ into the slots, no .item(), bincount or histc."""
    x = make("special", 3000, dtype)
    f, i, s, args = state()
    with no_host_sync() as ops:
        reference.accumulate_(x, f, i, s, ON, args)
    assert not any("bincount" in o or "histc" in o for o in ops)
    assert_state((f.numpy(), i.numpy()), x, exact_floats=True)


def test_opcheck_with_float_buckets():
    f, i, s, args = state(StatsConfig())
    for x in (torch.randn(33, 17), torch.randn(8, 3, 5, 5).to(memory_format=torch.channels_last),
              torch.randn(100, dtype=torch.bfloat16), torch.randn(70, dtype=torch.float64), torch.empty(0)):
        torch.library.opcheck(torch.ops.hookstats.accumulate_.default, (x, f, i, s, ON, args))
    torch.library.opcheck(torch.ops.hookstats.accumulate_many_.default,
                          ([torch.randn(5), torch.randn(7)], [f, f.clone()], [i, i.clone()], [s, s], ON, args))


@pytest.mark.slow  # this file's tests again per kernel, in a new process
@pytest.mark.parametrize("kernel", CPU_KERNELS)
def test_every_cpu_kernel_passes_the_float_bucket_tests(kernel):
    failure = failure_with_kernel(__file__, "compiled and not every_cpu_kernel or thread_count", kernel)
    assert failure is None, failure


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_millions_of_one_value_overflow_no_counter_at_any_thread_count(dtype):
    """One value 3 M times (its slot's 16-bit counters flushed many times over), misaligned, from an expanded
    single element and next to a run of NaN/Inf: each bucket exact under 1 and 2 threads."""
    op = torch.ops.hookstats.accumulate_.default
    tiny = {torch.float16: 6e-8, torch.float64: 1e-310}.get(dtype, 1e-40)  # a subnormal of the dtype
    for v in (0.0, 1.0, -tiny):
        x = torch.full((3_000_001,), v, dtype=dtype)
        x[:70_000] = math.nan
        x[-70_000:] = -math.inf
        for part in (x[1:], torch.tensor([v], dtype=dtype).expand(2_100_000)):
            for got in on_thread_counts(lambda: run(op, [part], StatsConfig(near_zero="le", eps=1e-3, float_hist=False))):
                assert_state(got, part, StatsConfig(near_zero="le", eps=1e-3, float_hist=False), moments=False)
