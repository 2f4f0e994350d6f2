"""The state holds only what the flags measure: the istate's size for every flag combination,
written out by hand after the op counters (one slot per counter row); the compiled op's offsets equal hookstats/layout.py's; monitors with the linear bins, with
the op's log2 slots alone and with the defaults give the statistics of a float64 NumPy oracle; a history ring
slot holds only the measured fields and stays exact across flushes."""
import math
import types

import numpy as np
import pytest
import torch
from helpers import float_buckets, oracle_parts
from torch import nn

import hookstats
from hookstats import layout, rawstate, reference
from hookstats.config import StatsConfig

LIN, LOG, SNZ, FLT = 1, 2, 4, 8  # csrc/accumulator.h Flags
NC = len(rawstate.COUNTERS)  # the op counters (count, near-zero, ...): one slot per csrc/state_layout.def row

# istate sizes by hand for nbins=40 after the NC op counters: under + 40 bins + over (42) with LIN, NaN/+Inf/-Inf (3)
# always, log2 slots (256) with LOG, float buckets (4096) with FLT; SNZ (near_zero="le") changes no size
SIZES_40 = {flags: NC + size for flags, size in {0: 3, LIN: 45, LOG: 259, LIN | LOG: 301, FLT: 4099, FLT | LIN: 4141,
                                                 FLT | LOG: 4355, FLT | LIN | LOG: 4397}.items()}
# the same for nbins=7 (under + 7 bins + over: 9)
SIZES_7 = {flags: NC + size for flags, size in {0: 3, LIN: 12, LOG: 259, LIN | LOG: 268, FLT: 4099, FLT | LIN: 4108,
                                                FLT | LOG: 4355, FLT | LIN | LOG: 4364}.items()}


@pytest.mark.parametrize("nbins,sizes", [(40, SIZES_40), (7, SIZES_7)])
@pytest.mark.parametrize("flags", range(16))
def test_istate_size_of_every_flag_combination(flags, nbins, sizes):
    want = sizes[flags & ~SNZ]
    assert layout.istate_size(nbins, flags) == want
    assert torch.ops.hookstats.istate_offsets(nbins, flags)[-1] == want
    params = layout.op_params(0.0, 1.0, 0.0, nbins, flags)
    x = torch.tensor([1.0, math.nan, -math.inf, 0.0])
    for op in (torch.ops.hookstats.accumulate_.default, reference.accumulate_):
        f = rawstate.empty()
        op(x, f, torch.zeros(want, dtype=torch.int64), torch.zeros(0, dtype=torch.uint8), torch.tensor([True]), params)
        for wrong in (want - 1, want + 1):
            with pytest.raises(RuntimeError, match=f"istate must have {want} elements"):
                op(x, f, torch.zeros(wrong, dtype=torch.int64), torch.zeros(0, dtype=torch.uint8),
                   torch.tensor([True]), params)


@pytest.mark.parametrize("kwargs,size", [({}, 4099), ({"linear_hist": True}, 4141), ({"float_hist": False}, 259),
                                         ({"float_hist": False, "linear_hist": True}, 301),
                                         ({"float_hist": False, "log_hist": False}, 3),
                                         ({"nbins": 7, "near_zero": "le"}, 4108)])
def test_config_state_size(kwargs, size):
    assert StatsConfig(**kwargs).istate_size == NC + size


def test_python_offsets_mirror_the_header():
    for nbins in (1, 2, 7, 40, 255, 256):
        for flags in range(16):
            assert list(torch.ops.hookstats.istate_offsets(nbins, flags)) == list(layout.offsets(nbins, flags))


def field_oracle(x, nbins, flags, lo, hi, eps):
    """What each raw field (hookstats/rawstate.py) holds after one call on x, from the float64 NumPy oracle; None for
    a field the flags keep no slots for."""
    cfg = types.SimpleNamespace(nbins=nbins, eps=eps, near_zero="le" if flags & SNZ else "abs",
                                linear_hist=bool(flags & LIN), log_hist=bool(flags & LOG), float_hist=False,
                                lo32=float(np.float32(lo)), inv_w=nbins / (hi - lo))
    p = oracle_parts(x, cfg)
    f = p["fstate"]
    return {"n_finite": f[:1], "mean": f[1:2], "m2": f[2:3], "min": f[3:4], "max": f[4:5],
            **{name: [p[name]] for name in layout.COUNTERS},  # the op counters, by the oracle's name for each
            "linear": p["lin"][: nbins + 2] if flags & LIN else None,
            "nonfinite": p["lin"][nbins + 2:], "log2": p["log2"],
            "float_buckets": float_buckets(x) if flags & FLT else None}


@pytest.mark.parametrize("nbins", [1, 7, 40, 256])
@pytest.mark.parametrize("flags", range(16))
def test_every_field_of_the_table_is_where_the_compiled_op_writes_it(flags, nbins):
    """Every slot of every flag combination, checked against the compiled op: each field of rawstate.FIELDS, read at
    its slots (its part's layout: layout.py, mirroring csrc/accumulator.h) from a state the op filled, holds what the
    oracle says that field holds; the fields the flags keep tile fstate and istate, so no slot is unread."""
    rng = np.random.default_rng(nbins * 16 + flags)
    x = rng.normal(size=300) * np.exp2(rng.integers(-40, 10, 300))
    x[:7] = [0.0, -0.0, 1e-40, np.nan, np.nan, np.inf, -np.inf]
    x = torch.tensor(rng.permutation(np.concatenate([x, [-np.inf] * 2, [np.inf] * 3, [5.0, -9.0]])),
                     dtype=torch.float32)
    lo, hi, eps = -2.0, 3.0, 1e-3
    f, i = rawstate.empty(layout.istate_size(nbins, flags))
    torch.ops.hookstats.accumulate_.default(x, f, i, torch.zeros(0, dtype=torch.uint8), torch.tensor([True]),
                                            layout.op_params(lo, nbins / (hi - lo), eps, nbins, flags))
    want = field_oracle(x, nbins, flags, lo, hi, eps)
    covered = {rawstate.FSTATE: [], rawstate.ISTATE: []}
    for fd in rawstate.FIELDS:
        at = rawstate.slots(fd.name, nbins, flags)
        got = (f if fd.part == rawstate.FSTATE else i)[at].numpy()
        assert (got.size == 0) == (want[fd.name] is None), fd.name
        if got.size and fd.name in ("mean", "m2"):  # to 1e-6 of the spread (README)
            std = math.sqrt(want["m2"][0] / want["n_finite"][0])
            np.testing.assert_allclose(got, want[fd.name], rtol=1e-6, atol=1e-6 * std, err_msg=fd.name)
        elif got.size:
            np.testing.assert_array_equal(got, want[fd.name], err_msg=fd.name)
        covered[fd.part] += range(at.start, at.stop)
    assert sorted(covered[rawstate.FSTATE]) == list(range(f.numel()))
    assert sorted(covered[rawstate.ISTATE]) == list(range(i.numel()))


def test_nonfinite_counters_where_the_layout_says():
    """NaN, +Inf, -Inf follow the op counters, or the linear bins' overflow slot (NC + nbins + 2) when there are
    bins."""
    x = torch.tensor([math.nan, math.nan, math.inf, -math.inf, -math.inf, -math.inf, 1.0])
    for flags, at in ((0, NC), (LOG | FLT, NC), (LIN, NC + 40 + 2), (LIN | LOG | FLT, NC + 40 + 2)):
        i = torch.zeros(SIZES_40[flags], dtype=torch.int64)
        f = rawstate.empty()
        torch.ops.hookstats.accumulate_.default(x, f, i, torch.zeros(0, dtype=torch.uint8), torch.tensor([True]),
                                                layout.op_params(-10.0, 2.0, 0.0, 40, flags))
        assert i[at: at + 3].tolist() == [2, 1, 3], flags


# ---- monitors against a float64 NumPy oracle ----
CONFIGS = {"defaults": {}, "linear": {"linear_hist": True, "nbins": 16, "lo": -4.0, "hi": 4.0},
           "log only": {"float_hist": False}}


class Mul(nn.Module):
    """x * w with w = 1 (values pass through, NaN and Inf included); a parameter, so attach() hooks it."""

    def __init__(self, n):
        super().__init__()
        self.w = nn.Parameter(torch.ones(n))

    def forward(self, x):
        return x * self.w


def batch(step, rng):
    """float32 values over many scales, exact zeros, tiny values, and NaN/Inf at some steps."""
    x = rng.normal(size=(8, 16)) * np.exp2(rng.integers(-30, 20, (8, 16)))
    x[0, :3] = 0.0
    x[1, :2] = 1e-40
    if step % 3 == 1:
        x[2, :2] = np.nan
        x[3, 0], x[3, 1] = np.inf, -np.inf
    return torch.tensor(x, dtype=torch.float32)


def numpy_stats(v, cfg):
    """The statistics of float32 values v, in float64 NumPy: moments of the finite ones, counts, histograms."""
    v = np.asarray(v, dtype=np.float32).reshape(-1)
    d = v.astype(np.float64)
    fin = d[np.isfinite(d)]
    out = {"count": v.size, "finite": fin.size, "mean": fin.mean(), "std": fin.std(ddof=1), "min": fin.min(),
           "max": fin.max(), "near_zero_count": int((np.abs(d) <= np.float32(cfg.eps)).sum()),
           "nan": int(np.isnan(d).sum()), "posinf": int(np.isposinf(d).sum()), "neginf": int(np.isneginf(d).sum())}
    if cfg.linear_hist:  # the kernels bin in float32: t = (v - lo) * (nbins / (hi - lo))
        with np.errstate(over="ignore", invalid="ignore"):
            t = (v[np.isfinite(v)] - np.float32(cfg.lo)) * np.float32(cfg.nbins / (cfg.hi - cfg.lo))
        slot = np.floor(np.clip(t, -1, cfg.nbins)).astype(np.int64) + 1
        counts = np.bincount(slot, minlength=cfg.nbins + 2)
        out.update(underflow=int(counts[0]), overflow=int(counts[-1]), hist=counts[1:-1])
    a = np.abs(fin)
    _, e = np.frexp(a)  # a in [2**(e-1), 2**e)
    out["log2_hist"] = np.bincount(np.where(a == 0, 0, np.where(a < 2.0 ** -126, 1, e - 1 + 126 + 2)), minlength=256)
    if cfg.float_hist:
        out["float_hist"] = float_buckets(torch.from_numpy(v))
    return out


def assert_stats(got, want):
    for k, w in want.items():
        if k in ("mean", "std"):  # to 1e-6 of the spread (README): the mean of values over 50 binades cancels
            np.testing.assert_allclose(got[k], w, rtol=1e-6, atol=1e-6 * want["std"], err_msg=k)
        elif isinstance(w, np.ndarray):
            np.testing.assert_array_equal(got[k], w, err_msg=k)
        elif k in got:
            assert got[k] == w, (k, got[k], w)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_running_stats_equal_a_numpy_oracle(config, backend):
    model = nn.Sequential(Mul(16), Mul(16))
    seen = []
    model[0].register_forward_hook(lambda m, i, o: seen.append(o.detach().clone()))
    mon = hookstats.attach(model, grads=False, hist_every=1, **CONFIGS[config])  # every step's bins: the oracle's
    rng = np.random.default_rng(0)
    with torch.no_grad():
        for step in range(5):
            model(batch(step, rng))
    mon.remove()
    want = numpy_stats(torch.cat(seen).numpy(), mon.cfg)
    got = mon.stats()["0:output"]
    assert (got["hist"] is None) != mon.cfg.linear_hist and (got["float_hist"] is None) != mon.cfg.float_hist
    assert_stats(got, want)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_ring_slot_holds_only_the_measured_fields_exact_across_flushes(config, backend):
    """A ring slot: the 5 moments, the op counters, [under, bins, over] with the linear bins, NaN/+Inf/-Inf and
    the op's log2 slots when it keeps them (float buckets off); every step's record equals the oracle of that
    step's values over 3 flushes, the float buckets (and log2 from them) too."""
    cfg = StatsConfig(hist_every=1, **CONFIGS[config])
    # + 1: the step's own largest |x| (the delayed-scaling what-if's amax history)
    fields = 5 + NC + (cfg.nbins + 2 if cfg.linear_hist else 0) + 3 + (0 if cfg.float_hist else 256) + 1

    class Keep:
        def __init__(self):
            self.records = {}

        def write(self, step, records):
            self.records.update({(step, r["target"]): r for r in records})

        def close(self):
            pass

    keep = Keep()
    model = nn.Sequential(Mul(16), Mul(16))
    seen = {}
    model[0].register_forward_hook(lambda m, i, o: seen.setdefault(len(seen), o.detach().clone()))
    # hist_every=1: every step's record carries its own bins (the cadence: tests/test_hist_cadence.py)
    mon = hookstats.attach(model, grads=False, history=True, log_every=3, steps="manual", sinks=[keep], alerts=False,
                           hist_every=1, **CONFIGS[config])
    rng = np.random.default_rng(1)
    with torch.no_grad():
        for step in range(8):
            model(batch(step, rng))
            mon.step()
    (ring,) = mon.step_history.rings.values()
    assert ring.slots.shape[-1] == fields
    mon.remove()
    assert sorted(s for s, t in keep.records if t == "0:output") == list(range(8))
    for step in range(8):
        got, want = keep.records[(step, "0:output")], numpy_stats(seen[step].numpy(), cfg)
        for k in ("min", "max"):
            want.pop(k, None)  # min/max are running values in the history
        assert_stats(got, want)


@pytest.mark.parametrize("op", [torch.ops.hookstats.accumulate_.default, reference.accumulate_],
                         ids=["compiled", "reference"])
def test_a_state_sized_for_other_flags_is_an_error_naming_the_flags(op):
    f = rawstate.empty()
    args = (torch.zeros(0, dtype=torch.uint8), torch.tensor([True]))
    with pytest.raises(RuntimeError, match=f"istate must have {NC + 45} elements for nbins=40, flags=1, got "
                                           f"{NC + 301}$"):
        op(torch.ones(3), f, torch.zeros(SIZES_40[LIN | LOG], dtype=torch.int64), *args,
           layout.op_params(-10.0, 2.0, 0.0, 40, LIN))
    with pytest.raises(RuntimeError, match=f"istate must have {NC + 3} elements for nbins=40, got {NC + 4}$"):
        op(torch.ones(3), f, torch.zeros(NC + 4, dtype=torch.int64), *args, layout.op_params(-10.0, 2.0, 0.0, 40, 0))
