"""The op (compiled kernel and reference) against an independent float64 NumPy oracle."""
import dataclasses
import math

import numpy as np
import pytest
import torch
from conftest import DTYPES
from helpers import CPU_KERNELS, failure_with_kernel, on_thread_counts, oracle, without_histograms

import hookstats
from hookstats import layout, rawstate, reference
from hookstats.config import StatsConfig

CFG = StatsConfig(linear_hist=True, float_hist=False)  # the kernel's linear bins and log2 slots (buckets: test_float_hist.py)
ON = torch.tensor([True])


def fresh(cfg=CFG, device="cpu"):
    f = rawstate.empty(device=device)
    i = torch.zeros(cfg.istate_size, dtype=torch.int64, device=device)
    return f, i, torch.zeros(0, dtype=torch.uint8, device=device)


def run(op, xs, cfg=CFG, enabled=ON):
    f, i, s = fresh(cfg)
    for x in xs:
        op(x, f, i, s, enabled, cfg.op_params())
    return f.numpy(), i.numpy()


def make(kind, n, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64)
    if kind == "zeros":
        x = torch.zeros(n, dtype=torch.float64)
    elif kind == "relu":
        x = torch.relu(x)
    elif kind == "nonfinite":
        x[::13] = math.nan
        x[5::17] = math.inf
        x[7::19] = -math.inf
    elif kind == "edges":  # exactly on the linear bin edges (w = 0.5), on lo and hi, and beyond
        e = torch.from_numpy(CFG.edges())
        x = e[torch.randint(0, len(e), (n,), generator=g)] + torch.tensor([0.0, 0.0, 20.0, -20.0]).repeat(n)[:n]
    elif kind == "outliers":
        x[::211] = 1e6
    elif kind == "offset":
        x = 1e4 + 1e-3 * x
    elif kind == "steps":  # the mean jumps every 1000 values, off the kernels' blocks: a block's shift is far off
        x = x + 1e3 * (torch.arange(n) // 1000 % 2)
    elif kind == "channels":  # NCHW planes of 256 values, each with its own mean: most blocks' shift is far off
        x = x + 10 * torch.randn(n // 256 + 1, generator=g, dtype=torch.float64).repeat_interleave(256)[:n]
    elif kind == "ramp":  # the mean drifts by ~3 standard deviations per 1024 values
        x = 1e-3 * x + 1e-5 * torch.arange(n, dtype=torch.float64)
    elif kind == "huge":  # fp32 squares and sums of these overflow: the kernels redo such blocks in fp64
        x = x * {torch.float64: 1e150, torch.float16: 8e3}.get(dtype, 5e37)
    elif kind == "huge_outliers":  # an exploding activation among ordinary ones (float16: +-inf)
        x[::211] = 1e30
        x[100::307] = -3e38
    elif kind in TINY:  # vanishing gradients: fp32 squares of these underflow; the kernels redo such blocks in fp64
        small, large, offset = TINY[kind][dtype]
        scale = torch.full_like(x, small)
        scale[::16] = large
        x = offset + scale * x
    return x.to(dtype)


# kind: {dtype: (scale, scale of every 16th value, offset)}. float16 values never underflow in fp32 (its smallest
# is 2^-24); float64 ones down to where M2 still fits the float64 state (squares below ~1e-308 are subnormal there).
TINY = {
    "tiny": {torch.float32: (1e-25, 1e-25, 0), torch.bfloat16: (1e-25, 1e-25, 0), torch.float16: (1e-6, 1e-6, 0),
             torch.float64: (1e-150, 1e-150, 0)},
    "subnormal": {torch.float32: (1e-39, 1e-39, 0), torch.bfloat16: (1e-39, 1e-39, 0),
                  torch.float16: (1e-5, 1e-5, 0), torch.float64: (1e-150, 1e-150, 0)},
    "tiny_mixed": {torch.float32: (1e-25, 1e-22, 0), torch.bfloat16: (1e-25, 1e-22, 0),
                   torch.float16: (1e-6, 1e-3, 0), torch.float64: (1e-150, 1e-146, 0)},
    "tiny_offset": {torch.float32: (1e-24, 1e-24, 1e-20), torch.bfloat16: (1e-22, 1e-22, -1e-20),
                    torch.float16: (1e-5, 1e-5, 1e-3), torch.float64: (1e-150, 1e-150, 1e-143)},
}


def assert_matches(got, want, dtype, exact_floats=False):
    (fg, ig), (fw, iw) = got, want
    np.testing.assert_array_equal(ig, iw, err_msg="integer statistics differ")
    assert fg[layout.N_FINITE] == fw[layout.N_FINITE]
    np.testing.assert_array_equal(fg[layout.MIN:], fw[layout.MIN:], err_msg="min/max differ")
    n = fw[layout.N_FINITE]
    if n == 0:
        return
    # float64 two-pass (reference) vs oracle: rounding only. Kernel, float64 input: M2 of data with
    # |mean|/std = 1e7 is conditioned to ~1e-9. Kernel, 32-bit inputs: fp32 sums of <= 8 values per lane.
    std = math.sqrt(fw[layout.M2] / n)
    tol_mean, tol_m2 = (1e-14, 1e-14) if exact_floats else (1e-13, 1e-8) if dtype == torch.float64 else (1e-7, 1e-6)
    assert abs(fg[layout.MEAN] - fw[layout.MEAN]) <= tol_mean * (abs(fw[layout.MEAN]) + std), "mean"
    assert abs(fg[layout.M2] - fw[layout.M2]) <= tol_m2 * fw[layout.M2], "M2"


KINDS = ["normal", "zeros", "relu", "nonfinite", "edges", "outliers", "offset", "steps", "channels", "ramp", "huge",
         "huge_outliers", *TINY]
# The CPU kernels take another path without the linear and log2 histograms (the moments in one pass per block).
MOMENTS_ONLY = StatsConfig(linear_hist=False, log_hist=False, float_hist=False)


@pytest.mark.parametrize("cfg", [CFG, MOMENTS_ONLY], ids=["hists", "moments"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
# The largest n: three full parallel chunks (kMinChunk = 2^15 values) and a shorter last one ending 3 values into a
# block, the merge in chunk order; chunks grow only past 2^25 values (kMaxChunks), which a million did not reach.
@pytest.mark.parametrize("n", [0, 1, 7, 4097, 3 * 2**15 + 2**14 + 3])
@pytest.mark.parametrize("kind", KINDS)
def test_op_against_float64_oracle(op, kind, n, dtype, cfg):
    x = make(kind, n, dtype)
    exact = op is reference.accumulate_
    assert_matches(run(op, [x], cfg), oracle(x, cfg), dtype, exact_floats=exact)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n", [63, 65, 255, 257, 1023, 1025, 2**15 - 1, 2**15 + 1, 3 * 2**15 + 300])
@pytest.mark.parametrize("kind", ["tiny_mixed", "tiny_offset"])
@pytest.mark.parametrize("cfg", [CFG, MOMENTS_ONLY], ids=["hists", "moments"])
def test_tiny_values_across_block_and_chunk_boundaries(op, kind, n, dtype, cfg):
    """Portable blocks of 64, AVX2 blocks of 256 and 1024, parallel chunks of 2^15 and the tails between them."""
    x = make(kind, n, dtype, seed=n)
    assert_matches(run(op, [x], cfg), oracle(x, cfg), dtype, exact_floats=op is reference.accumulate_)


def test_bin_edges_are_half_open(op):
    # lo=-10, hi=10, 40 bins of width 0.5: edge k belongs to bin k; hi is overflow; below lo underflow
    x = torch.tensor([-10.0, -9.5, -0.0, 0.0, 0.5, 9.5, 9.999, 10.0, -10.001, 1e30, -1e30])
    _, i = run(op, [x])
    lin = i[layout.LIN_BASE: layout.LIN_BASE + layout.lin_slots(40)]
    assert lin[0] == 2  # -10.001, -1e30
    assert lin[1] == 1 and lin[2] == 1  # -10 -> bin 0, -9.5 -> bin 1
    assert lin[1 + 20] == 2 and lin[1 + 21] == 1  # +-0 -> bin 20, 0.5 -> bin 21
    assert lin[1 + 39] == 2  # 9.5, 9.999 -> last bin
    assert lin[41] == 2  # 10.0 and 1e30 -> overflow


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_log2_slots_cover_the_dynamic_range(op, dtype):
    vals = [0.0, 1.0, 1.5, 2.0, 0.75, -3.0, 2.0 ** -20, 40000.0]
    if dtype in (torch.float32, torch.float64):
        vals += [2.0 ** -126, 2.0 ** -130, 2.0 ** 127, 3e38]
    if dtype == torch.float64:
        vals += [1e-300, 1e300]  # beyond float32: binned at the ends, never as non-finite
    x = torch.tensor(vals, dtype=dtype)
    _, i = run(op, [x])
    lg = i[layout.log_base(40, CFG.flags):]
    slot = lambda e: 2 + e - layout.LOG_EXP_MIN  # noqa: E731  |x| in [2**e, 2**(e+1))
    assert lg[0] == 1 and lg[slot(0)] == 2 and lg[slot(1)] == 2 and lg[slot(-1)] == 1 and lg[slot(-20)] == 1
    assert lg[slot(15)] == 1
    if dtype in (torch.float32, torch.float64):
        wide = dtype == torch.float64
        assert lg[slot(-126)] == 1
        assert lg[slot(127)] == 2 + wide  # 2**127, 3e38 (and 1e300)
        assert lg[1] == 1 + wide  # 2**-130 (and 1e-300)
    assert i[layout.nonfinite_base(40, CFG.flags) + 1] == 0  # no +Inf
    assert lg.sum() == len(vals)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_accumulating_many_calls_equals_one_call_on_the_concatenation(op, dtype):
    parts = [make(k, n, dtype, seed=s) for s, (k, n) in enumerate(
        [("normal", 5000), ("outliers", 70001), ("nonfinite", 333), ("relu", 1), ("offset", 4097)])]
    whole = torch.cat(parts)
    got = run(op, parts)
    assert_matches(got, oracle(whole, CFG), dtype, exact_floats=op is reference.accumulate_)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kernel_and_reference_agree(dtype):
    x = make("outliers", 300_001, dtype, seed=3)
    k = run(torch.ops.hookstats.accumulate_.default, [x, x[:1000]])
    r = run(reference.accumulate_, [x, x[:1000]])
    assert_matches(k, r, dtype)


def test_result_does_not_depend_on_the_thread_count():
    x = make("outliers", 2_000_003, torch.float32, seed=4)
    one, two = on_thread_counts(lambda: run(torch.ops.hookstats.accumulate_.default, [x]))
    np.testing.assert_array_equal(one[0], two[0])
    np.testing.assert_array_equal(one[1], two[1])


LAYOUTS = {
    "transposed": lambda x: x.reshape(64, -1).t(),
    "channels_last": lambda x: x.reshape(4, 8, 16, -1).contiguous(memory_format=torch.channels_last),
    "sliced": lambda x: x.reshape(64, -1)[:, 3:-5],
    "strided": lambda x: x[::3],
    "misaligned": lambda x: x[1:],
    "expanded": lambda x: x[:97].reshape(97, 1).expand(97, 5),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout_name", list(LAYOUTS))
@pytest.mark.parametrize("kind", ["nonfinite", "tiny_mixed"])
def test_non_contiguous_views(op, kind, layout_name, dtype):
    x = LAYOUTS[layout_name](make(kind, 64 * 16 * 8 * 4, dtype, seed=5))
    assert_matches(run(op, [x]), oracle(x, CFG), dtype, exact_floats=op is reference.accumulate_)


@pytest.mark.parametrize("cfg", [
    StatsConfig(linear_hist=False, float_hist=False), StatsConfig(linear_hist=True, log_hist=False, float_hist=False),
    StatsConfig(linear_hist=False, log_hist=False, float_hist=False),
    StatsConfig(near_zero="le", eps=0.05, lo=0.0, hi=10.0, nbins=40, float_hist=False),
    StatsConfig(nbins=1, float_hist=False), StatsConfig(nbins=256, float_hist=False),
    StatsConfig(nbins=7, lo=-1e-3, hi=3e-3, eps=0.0, float_hist=False),
    StatsConfig(), StatsConfig(nbins=7, lo=-1.0, hi=3.0),  # the defaults (float buckets, no log2 slots), + linear
], ids=lambda c: f"nb{c.nbins}-{c.near_zero}-lin{int(c.linear_hist)}-log{int(c.log_hist)}-flt{int(c.float_hist)}")
def test_configurations(op, cfg):
    x = make("nonfinite", 20011, torch.float32, seed=6)
    assert_matches(run(op, [x], cfg), oracle(x, cfg), torch.float32, exact_floats=op is reference.accumulate_)


def test_disabled_flag_leaves_the_state_untouched(op):
    x = make("normal", 1000, torch.float32)
    f0, i0 = run(op, [x])
    f, i = run(op, [x, x * 7], enabled=torch.tensor([False]))
    f1, i1 = fresh()[:2]
    np.testing.assert_array_equal(i, i1.numpy())
    np.testing.assert_array_equal(f, f1.numpy())
    assert i0[layout.COUNT] == 1000


# enabled values: 0 off; any other value runs the call; with bit SKIP_HIST (2) set, without the histograms
SKIP = {"uint8-3": torch.tensor([3], dtype=torch.uint8), "int64-2": torch.tensor([2]),
        "int32-3": torch.tensor([3], dtype=torch.int32)}
EVERYTHING = {"bool": ON, "int64-256": torch.tensor([256]), "uint8-1": torch.tensor([1], dtype=torch.uint8)}


@pytest.mark.parametrize("cfg", [CFG, StatsConfig(), StatsConfig(nbins=7, lo=-1.0, hi=3.0, log_hist=False)],
                         ids=["lin-log", "buckets", "lin-buckets"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("flag", SKIP, ids=str)
def test_skip_hist_flag_counts_everything_but_the_histograms(op, cfg, dtype, flag):
    """One call with every histogram, then two with SKIP_HIST: the histograms hold the first tensor's values;
    count, moments, min/max, near-zero and NaN/Inf all three calls'."""
    x, y = make("nonfinite", 20011, dtype, seed=3), make("outliers", 4097, dtype, seed=4)
    f, i, s = fresh(cfg)
    op(x, f, i, s, ON, cfg.op_params())
    for t in (y, x):
        op(t, f, i, s, SKIP[flag], cfg.op_params())
    fw, _ = oracle(torch.cat([x, y, x]), cfg)
    iw = oracle(x, cfg)[1] + without_histograms(oracle(y, cfg)[1], cfg) + without_histograms(oracle(x, cfg)[1], cfg)
    assert_matches((f.numpy(), i.numpy()), (fw, iw), dtype, exact_floats=op is reference.accumulate_)


@pytest.mark.parametrize("flag", EVERYTHING, ids=str)
def test_nonzero_flags_without_the_skip_bit_count_everything(op, flag):
    cfg = StatsConfig(nbins=7, lo=-1.0, hi=3.0)
    x = make("nonfinite", 5003, torch.float32, seed=5)
    assert_matches(run(op, [x], cfg, enabled=EVERYTHING[flag]), oracle(x, cfg), torch.float32,
                   exact_floats=op is reference.accumulate_)


@pytest.mark.parametrize("backend", ["compiled", "reference"])
def test_accumulate_many_skips_the_histograms_of_every_target(backend):
    cfg = StatsConfig(linear_hist=True)
    op = torch.ops.hookstats.accumulate_many_ if backend == "compiled" else reference.accumulate_many_
    xs = [make("nonfinite", n, torch.bfloat16, seed=n) for n in (1, 4097, 30011)]
    states = [fresh(cfg) for _ in xs]
    for flag in (ON, SKIP["uint8-3"]):
        op(xs, *([st[k] for st in states] for k in range(3)), flag, cfg.op_params())
    for x, (f, i, _) in zip(xs, states):
        fw, _ = oracle(torch.cat([x, x]), cfg)
        iw = oracle(x, cfg)[1] + without_histograms(oracle(x, cfg)[1], cfg)
        assert_matches((f.numpy(), i.numpy()), (fw, iw), torch.bfloat16, exact_floats=backend == "reference")


@pytest.mark.parametrize("bad", [torch.arange(10), torch.ones(3, dtype=torch.bool),
                                 torch.ones(3, dtype=torch.complex64), torch.ones(3, dtype=torch.uint8)], ids=str)
def test_non_float_inputs_are_rejected_with_a_clear_error(op, bad):
    f, i, s = fresh()
    with pytest.raises(RuntimeError, match="float32, float64, float16 or bfloat16"):
        op(bad, f, i, s, ON, CFG.op_params())


def test_state_of_the_wrong_size_is_rejected(op):
    f, i, s = fresh(StatsConfig(nbins=10))
    with pytest.raises(RuntimeError, match="istate"):
        op(torch.ones(3), f, i, s, ON, CFG.op_params())


def _args(**change):
    """accumulate_'s arguments (x, fstate, istate, scratch, enabled, params), some replaced, params' fields
    (lo, inv_w, eps, nbins, flags) by name; a callable replacement gets the fresh arguments."""
    f, i, s = fresh()
    args = dict(x=torch.randn(100), fstate=f, istate=i, scratch=s, enabled=ON)
    fields = dict(zip(layout.PARAM_FIELDS, CFG.op_params()))
    for k, v in change.items():
        (fields if k in fields else args)[k] = v(args) if callable(v) else v
    args["params"] = change.get("params", layout.op_params(**fields))
    return args


def _inference_state():
    with torch.inference_mode():
        return fresh()[1]


NC = len(rawstate.COUNTERS)  # istate's op counters (count, near-zero, ...): one slot per csrc/state_layout.def row
BAD_ARGS = {  # case: (replacements, the error's words)
    "meta x, CPU state": (dict(x=torch.randn(10, device="meta")), "fstate must be on x's device"),
    "CPU x, meta istate": (dict(istate=lambda a: a["istate"].to("meta")), "istate must be on x's device"),
    "meta scratch": (dict(scratch=torch.zeros(0, dtype=torch.uint8, device="meta")), "scratch must be on x's device"),
    "meta enabled": (dict(enabled=torch.tensor([True], device="meta")), "enabled must be on x's device"),
    "NaN inv_w": (dict(inv_w=math.nan), "inv_w .* must be finite and > 0"),
    "inf inv_w": (dict(inv_w=math.inf), "inv_w .* must be finite and > 0"),
    "inv_w past float32": (dict(inv_w=1e39), "inv_w .* must be finite and > 0"),
    "zero inv_w": (dict(inv_w=0.0), "inv_w .* must be finite and > 0"),
    "NaN lo": (dict(lo=math.nan), "lo must be finite"),
    "lo past float32": (dict(lo=-1e39), "lo must be finite"),
    "NaN eps": (dict(eps=math.nan), "eps must be >= 0"),
    "negative eps": (dict(eps=-1.0), "eps must be >= 0"),
    "nbins 0": (dict(nbins=0), r"nbins must be in \[1, 256\]"),
    "flags 16": (dict(flags=16), "unknown flags 16"),
    "fractional nbins": (dict(nbins=40.5), r"nbins must be in \[1, 256\], got 40.5"),
    "NaN nbins": (dict(nbins=math.nan), r"nbins must be in \[1, 256\], got nan"),
    "fractional flags": (dict(flags=2.5), "unknown flags 2.5"),
    "params of 4 fields": (dict(params=CFG.op_params()[:4]),
                           r"params must have 5 fields \(lo, inv_w, eps, nbins, flags\), got 4"),
    "params of 6 fields": (dict(params=CFG.op_params() + (0.0,)), "params must have 5 fields .*, got 6"),
    "empty params": (dict(params=()), "params must have 5 fields .*, got 0"),
    "negative flags": (dict(flags=-1), "unknown flags -1"),
    "FLOAT_HIST, istate without its slots": (
        dict(flags=layout.FLOAT_HIST | 3),
        f"istate must have {NC + 4397} elements for nbins=40, flags=11, got {NC + 301}"),
    "istate with float slots, no FLOAT_HIST": (
        dict(istate=lambda a: torch.zeros(NC + 40 + 5 + 256 + 4096, dtype=torch.int64)),
        f"istate must have {NC + 301} elements for nbins=40, flags=3, got {NC + 4397}"),
    "float32 fstate": (dict(fstate=lambda a: a["fstate"].float()), "fstate must be float64, got"),
    "fstate of 4": (dict(fstate=lambda a: a["fstate"][:4]), "fstate must have 5 elements, got 4"),
    "float64 istate": (dict(istate=lambda a: a["istate"].double()), "istate must be int64, got"),
    "istate for other nbins": (dict(nbins=10), f"istate must have {NC + 271} elements for nbins=10, got {NC + 301}"),
    "strided istate": (dict(istate=lambda a: torch.zeros(2 * CFG.istate_size, dtype=torch.int64)[::2]),
                       "istate must be contiguous"),
    "expanded fstate": (dict(fstate=torch.zeros(1, dtype=torch.float64).expand(5)), "fstate must be contiguous"),
    "int64 scratch": (dict(scratch=torch.zeros(8, dtype=torch.int64)), "scratch must be uint8"),
    "strided scratch": (dict(scratch=torch.zeros(16, dtype=torch.uint8)[::2]), "scratch must be contiguous"),
    "float enabled": (dict(enabled=torch.tensor([1.0])), "enabled must be bool, uint8, int32 or int64"),
    "two enabled": (dict(enabled=torch.tensor([True, True])), "enabled must have one element, got 2"),
    "fstate requires grad": (dict(fstate=lambda a: a["fstate"].requires_grad_()), "fstate must not require grad"),
    "inference istate": (dict(istate=lambda a: _inference_state()), "istate is an inference tensor"),
    "fstate inside istate": (dict(fstate=lambda a: a["istate"][:5].view(torch.float64)),
                             "istate and fstate share memory|fstate and istate share memory"),
    "x is fstate": (dict(x=lambda a: a["fstate"]), "fstate and x share memory|x and fstate share memory"),
    "scratch is istate": (dict(scratch=lambda a: a["istate"].view(torch.uint8)),
                          "scratch and istate share memory|istate and scratch share memory"),
}


@pytest.mark.parametrize("case", list(BAD_ARGS))
def test_bad_arguments_raise_one_error_naming_them(op, case):
    change, words = BAD_ARGS[case]
    a = _args(**change)
    state = lambda: [t.detach().numpy().tobytes() for t in (a["fstate"], a["istate"]) if t.device.type == "cpu"]  # noqa: E731
    before = state()
    with pytest.raises(RuntimeError, match=f"^hookstats.accumulate_: ({words})"):
        op(*a.values())
    assert state() == before, "a rejected call changed the state"


MANY = {"compiled": lambda: torch.ops.hookstats.accumulate_many_.default, "reference": lambda: reference.accumulate_many_}


def _many_args(n=3):
    states = [fresh() for _ in range(n)]
    return [torch.randn(50 + k) for k in range(n)], *[[s[j] for s in states] for j in range(3)]


@pytest.mark.parametrize("backend", list(MANY))
@pytest.mark.parametrize("case", ["lengths", "bad entry", "shared state", "x is another state", "bad inv_w"])
def test_bad_lists_raise_one_error_and_change_no_state(backend, case):
    xs, fs, is_, ss = _many_args()
    params = list(CFG.op_params())
    words = {"lengths": "xs, fstates, istates and scratches must have equal lengths, got 3, 3, 2, 3",
             "bad entry": rf"target\[2\]: istate must have {NC + 301} elements for nbins=40, got {NC + 300}",
             "shared state": r"fstate of target\[\d\] and fstate of target\[\d\] share memory",
             "x is another state": r"(x of target\[0\] and istate of target\[1\]|istate of target\[1\] and x of "
                                   r"target\[0\]) share memory",
             "bad inv_w": "inv_w"}[case]
    if case == "lengths":
        is_ = is_[:2]
    elif case == "bad entry":
        is_[2] = is_[2][:-1]
    elif case == "shared state":
        fs[2] = fs[0]
    elif case == "x is another state":
        xs[0] = is_[1].view(torch.float64)
    else:
        params[1] = math.nan
    before = [t.numpy().tobytes() for t in fs + is_]
    with pytest.raises(RuntimeError, match=f"^hookstats.accumulate_many_: {words}"):
        MANY[backend]()(xs, fs, is_, ss, ON, params)
    assert [t.numpy().tobytes() for t in fs + is_] == before, "a rejected list changed a state"


@pytest.mark.parametrize("backend", list(MANY))
def test_a_list_may_read_one_x_twice(backend):
    xs, fs, is_, ss = _many_args(2)
    xs[1] = xs[0]
    MANY[backend]()(xs, fs, is_, ss, ON, CFG.op_params())
    assert torch.equal(is_[0], is_[1]) and is_[0][layout.COUNT] == 50


def test_python_layout_mirrors_the_header():
    assert list(torch.ops.hookstats.layout()) == [layout.FSTATE_SIZE, layout.LIN_BASE, layout.LIN_EXTRA,
                                                   layout.LOG_SLOTS, layout.LOG_EXP_MIN, layout.MAX_BINS,
                                                   layout.FLOAT_HIST, layout.FLOAT_MANT_BITS, layout.FLOAT_SLOTS,
                                                   layout.FLOAT_BELOW, layout.FLOAT_ABOVE, layout.FLOAT_ZERO,
                                                   layout.SKIP_HIST]


def test_opcheck():
    f, i, s = fresh()
    for x in (torch.randn(33, 17), torch.randn(8, 3, 5, 5).to(memory_format=torch.channels_last),
              torch.randn(100, dtype=torch.bfloat16), torch.empty(0)):
        torch.library.opcheck(torch.ops.hookstats.accumulate_.default, (x, f, i, s, ON, CFG.op_params()))
    # torch 2.4 and 2.5 cannot functionalize lists of mutated tensors (docs/howto/compile.md): the multi-tensor op
    # is eager-only there, and the rest of opcheck still runs
    utils = ("test_schema", "test_autograd_registration", "test_faketensor") + \
        (() if torch.__version__ < (2, 6) else ("test_aot_dispatch_dynamic",))
    torch.library.opcheck(torch.ops.hookstats.accumulate_many_.default,
                          ([torch.randn(5), torch.randn(7)], [f, f.clone()], [i, i.clone()], [s, s],
                           ON, CFG.op_params()), test_utils=utils)


def test_many_equals_one_by_one():
    xs = [make("nonfinite", n, torch.float32, seed=n) for n in (3, 4097, 70000)]
    states = [fresh() for _ in xs]
    torch.ops.hookstats.accumulate_many_([x for x in xs], [s[0] for s in states], [s[1] for s in states],
                                         [s[2] for s in states], ON, CFG.op_params())
    for x, (f, i, _) in zip(xs, states):
        assert_matches((f.numpy(), i.numpy()), oracle(x, CFG), torch.float32)


def test_backend_reports_compiled_here():
    assert hookstats.backend() == "compiled"


@pytest.mark.slow  # this file's tests again per kernel, in a new process
@pytest.mark.parametrize("kernel", CPU_KERNELS)
def test_every_cpu_kernel_passes_the_oracle_tests(kernel):
    """Each CPU kernel this machine has runs this file's compiled-op tests (helpers.failure_with_kernel)."""
    failure = failure_with_kernel(__file__, "compiled and not every_cpu_kernel", kernel)
    assert failure is None, failure


def _odd_offset(dtype, n=100, byte_offset=1):
    """A view of external memory (torch.frombuffer) whose data pointer is not a multiple of its element size."""
    size = torch.empty(0, dtype=dtype).element_size()
    buf = bytearray(size * (n + 1) + 16)
    shift = (-torch.frombuffer(buf, dtype=torch.uint8).data_ptr()) % 16 + byte_offset  # odd whatever buf's address
    x = torch.frombuffer(buf, dtype=dtype, offset=shift, count=n)
    assert x.data_ptr() % size == byte_offset % size, "frombuffer gave an aligned view"
    return x, buf


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("byte_offset", [1, 3])
def test_x_not_element_aligned_is_refused_by_both_ops(op, dtype, byte_offset):
    """Element loads from such a pointer fault on a GPU and kill the CUDA context: every device and the
    reference refuse it with one error and change no state; an aligned copy is measured."""
    x, _buf = _odd_offset(dtype, byte_offset=byte_offset)
    f, i, s = fresh()
    with pytest.raises(RuntimeError, match=r"^hookstats.accumulate_: x's data pointer is not a multiple of its "
                                           rf"{x.element_size()}-byte element size .*x.clone\(\)"):
        op(x, f, i, s, ON, CFG.op_params())
    assert i[layout.COUNT] == 0 and f[layout.N_FINITE] == 0, "a refused call changed the state"
    op(x.clone(), f, i, s, ON, CFG.op_params())
    assert i[layout.COUNT] == 100


@pytest.mark.parametrize("backend", list(MANY))
def test_many_refuses_an_x_not_element_aligned_before_any_state_changes(backend):
    xs, fs, is_, ss = _many_args()
    x, _buf = _odd_offset(torch.bfloat16)
    xs[2] = x
    with pytest.raises(RuntimeError, match=r"^hookstats.accumulate_many_: target\[2\]: x's data pointer is not a "
                                           r"multiple of its 2-byte element size"):
        MANY[backend]()(xs, fs, is_, ss, ON, CFG.op_params())
    assert all(int(i[layout.COUNT]) == 0 for i in is_), "a refused list changed a state"


def test_op_params_are_the_configs_float32_scalars_built_once():
    cfg = StatsConfig(linear_hist=True, nbins=7, lo=-0.1, hi=0.3, eps=1e-3, near_zero="le")
    p = cfg.op_params()
    assert p is cfg.op_params() and all(type(v) is float for v in p)
    assert p == (float(np.float32(-0.1)), float(np.float32(7 / 0.4)), float(np.float32(1e-3)), 7.0,
                 float(layout.LINEAR_HIST | layout.SIGNED_NEAR_ZERO | layout.FLOAT_HIST))
    other = dataclasses.replace(cfg, nbins=9)
    assert other.op_params()[3] == 9.0 and cfg.op_params() is p
    assert cfg == dataclasses.replace(cfg) and "_op_params" not in repr(cfg)
