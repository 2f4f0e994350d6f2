"""History: per-step statistics from the device ring against a float64 NumPy oracle of each step's
tensors; ring wrap, every=N, reset, late targets, no host read in the step, bounded memory, sink failures."""
import math
import sys

import numpy as np
import pytest
import torch
from float_oracle import float_counts
from helpers import no_host_sync, oracle
from torch import nn

import hookstats
from hookstats.history import HistoryWarning
from hookstats.rawstate import combine_all, empty
from hookstats.records import finalize
from hookstats.sinks import MemorySink

pytestmark = pytest.mark.filterwarnings("error::hookstats.history.HistoryWarning")


class Recorder(nn.Module):
    """Linear layers that keep each step's outputs so the test can compute the oracle."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(6, 12), nn.Linear(12, 3)
        self.seen = []

    def forward(self, x):
        h = self.a(x)
        y = self.b(torch.relu(h))
        self.seen.append({"a:output": h.detach().clone(), "b:output": y.detach().clone()})
        return y


def run(model, mon, steps, scale=None, manual=False):
    for s in range(steps):
        x = torch.randn(4, 6) * (scale(s) if scale else 1.0)
        model(x).square().mean().backward()
        if manual:
            mon.step()


def check_step(rec, tensors, cfg):
    """One history record against the oracle of the tensors measured in that step."""
    parts = [oracle(t, cfg) for t in tensors]
    f, i = combine_all(parts)
    want = finalize(f, i, cfg)
    assert rec["count"] == want["count"] and rec["nan"] == want["nan"]
    np.testing.assert_allclose(rec["mean"], want["mean"], rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(rec["std"], want["std"], rtol=1e-6)
    assert rec["near_zero"] == want["near_zero"]
    np.testing.assert_array_equal(rec["hist"], want["hist"])
    np.testing.assert_array_equal(rec["log2_hist"], want["log2_hist"])
    assert (rec["underflow"], rec["overflow"]) == (want["underflow"], want["overflow"])


# the per-step histograms of the kernel (the linear bins, its log2 slots): with the default float buckets the
# log2 histogram comes once per flush instead (test_float_buckets_once_per_flush_window)
PER_STEP = dict(linear_hist=True, float_hist=False, hist_every=1)


def by_step(mon):
    return {(step, rec["target"]): rec for step, rec in mon.history_sink.items()}


@pytest.mark.parametrize("log_every, capacity", [(3, None), (10, 4), (1, None)])
def test_each_step_matches_the_oracle_of_that_steps_tensors(log_every, capacity):
    model = Recorder()
    # the kernel's own log2 slots, counted per step (float_hist=False): with float buckets the log2 histogram
    # comes with the buckets, once per flush (test_float_buckets_once_per_flush_window)
    mon = hookstats.attach(model, hist_every=1, history=capacity or True, log_every=log_every, nbins=8, lo=-2, hi=2,
                           float_hist=False)
    run(model, mon, 11)
    mon.remove()  # records the open last step
    got = by_step(mon)
    assert sorted({s for s, _ in got}) == list(range(11))
    for step, seen in enumerate(model.seen):
        for target, t in seen.items():
            check_step(got[(step, target)], [t], mon.cfg)
    # the running min/max are those of everything so far
    allb = torch.cat([s["b:output"].reshape(-1) for s in model.seen]).double()
    assert got[(10, "b:output")]["running_max"] == pytest.approx(allb.max().item())


def test_every_n_records_only_sampled_steps_and_manual_steps_work():
    model = Recorder()
    mon = hookstats.attach(model, history=True, log_every=4, every=3, steps="manual", **PER_STEP)
    run(model, mon, 10, manual=True)
    mon.remove()
    got = by_step(mon)
    assert sorted({s for s, _ in got}) == [0, 3, 6, 9]
    for step in (0, 3, 6, 9):
        check_step(got[(step, "a:output")], [model.seen[step]["a:output"]], mon.cfg)


def test_reset_between_steps_starts_the_next_step_afresh():
    model = Recorder()
    mon = hookstats.attach(model, history=True, log_every=2, steps="manual", **PER_STEP)
    run(model, mon, 3, manual=True)
    mon.reset()
    run(model, mon, 2, manual=True)
    mon.remove()
    got = by_step(mon)
    for step in range(5):
        check_step(got[(step, "b:output")], [model.seen[step]["b:output"]], mon.cfg)


@pytest.mark.parametrize("steps", ["manual", "forward"])
def test_reset_mid_step_restarts_the_totals_not_the_open_steps_record(steps):
    # reset() restarts the running totals; the open step's record keeps what it measured before the reset.
    # The steps after it measure far more than everything before: subtracting stale running counts gave
    # negative histogram counts there.
    model = Recorder()
    mon = hookstats.attach(model, hist_every=1, history=True, log_every=2, steps=steps, nbins=8, lo=-2, hi=2, alerts=False,
                           float_hist=False)
    sizes = {0: [4], 1: [4], 2: [4, 200], 3: [300], 4: [4]}  # the reset comes inside step 2
    for step, batch in sizes.items():
        for k, n in enumerate(batch):
            if step == 2 and k == 1:
                mon.reset()
            model(torch.randn(n, 6) * 0.01 + 5.0 if n > 100 else torch.randn(n, 6))  # big batches: few bins
            if steps == "forward":
                break  # one forward per step: the reset comes after step 2's forward instead
        if steps == "forward" and step == 2:
            mon.reset()
        if steps == "manual":
            mon.step()
    mon.remove()
    got = by_step(mon)
    assert sorted({s for s, _ in got}) == list(range(5))
    seen = iter(model.seen)
    per_step = {step: [next(seen) for _ in (batch if steps == "manual" else batch[:1])] for step, batch in sizes.items()}
    for step, forwards in per_step.items():
        for target in ("a:output", "b:output"):
            rec = got[(step, target)]
            for k in ("count", "near_zero_count", "nan", "underflow", "overflow", "hist", "log2_hist"):
                assert np.all(np.asarray(rec[k]) >= 0), (step, k)
            check_step(rec, [f[target] for f in forwards], mon.cfg)
    after = [f["b:output"] for f in model.seen[3:]]  # the forwards after the reset
    want = finalize(*combine_all([oracle(t, mon.cfg) for t in after]), mon.cfg)
    total = mon.stats()["b:output"]
    assert total["count"] == want["count"] and total["mean"] == pytest.approx(want["mean"], rel=1e-6)
    np.testing.assert_array_equal(total["hist"], want["hist"])


@pytest.mark.parametrize("capacity,log_every,steps", [(None, 3, 8), (2, 3, 8), (None, 20, 40)],
                         ids=["ring", "small-ring", "more-steps-than-snapshots"])
def test_float_buckets_are_each_steps_own(capacity, log_every, steps):
    """Defaults (float buckets on), hist_every=1: every step's record has its own moments and counts, and its own
    float buckets (and the log2 histogram read from them), exactly those of its values: a mon.reset() inside a
    window, a ring that fills before the flush, a window with more histogram steps than the ring keeps bucket
    snapshots for, included."""
    model = Recorder()
    mon = hookstats.attach(model, hist_every=1, history=capacity or True, log_every=log_every, alerts=False)
    assert mon.cfg.float_hist and not mon.cfg.linear_hist
    for step in range(steps):
        model(torch.randn(4, 6) * 10.0 ** (step % 8 - 4)).square().mean().backward()
        if step == 4:
            mon.reset()
    mon.remove()
    got = by_step(mon)
    assert sorted({s for s, _ in got}) == list(range(steps))
    for step in range(steps):
        for target in ("a:output", "b:output"):
            rec, t = got[(step, target)], model.seen[step][target]
            f, i = oracle(t, mon.cfg)
            want = finalize(f, i, mon.cfg)
            assert rec["count"] == want["count"] and rec["near_zero_count"] == want["near_zero_count"]
            scale = 1e-6 * t.abs().max().item()  # float32 sums: a cancelling mean is exact to its values' scale
            np.testing.assert_allclose(rec["mean"], want["mean"], rtol=1e-6, atol=scale)
            np.testing.assert_allclose(rec["std"], want["std"], rtol=1e-6, atol=scale)
            np.testing.assert_array_equal(rec["float_hist"], float_counts(t.reshape(-1)), err_msg=f"{step} {target}")
            np.testing.assert_array_equal(rec["log2_hist"], want["log2_hist"])
            assert rec["hist_count"] == t.numel()


def test_history_device_memory_does_not_grow_with_steps_and_host_memory_stops_at_keep():
    model = Recorder()
    mon = hookstats.attach(model, history=True, log_every=5, keep=20)
    run(model, mon, 10)
    mon.flush()
    after_10 = mon.memory()
    run(model, mon, 190)
    mon.flush()
    after_200 = mon.memory()
    host = after_200.pop("host_history_bytes")
    assert {k: v for k, v in after_10.items() if k != "host_history_bytes"} == after_200
    # per target and kept step: the scalars and the span of log2 slots; the float buckets on one step in 5
    assert after_10["host_history_bytes"] <= host < 2 * 20 * (2_000 + 4096 * 10 // 5)
    assert len(mon.history_sink.steps) == 20


def test_several_forwards_in_one_step_and_a_target_that_appears_later():
    class Late(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(1)
            self.a, self.late = nn.Linear(4, 4), nn.Linear(4, 4)
            self.use_late = False

        def forward(self, x):
            h = self.a(x)
            return self.late(h) if self.use_late else h

    model = Late()
    mon = hookstats.attach(model, history=True, log_every=3, steps="manual", modules=["a", "late"], **PER_STEP)
    # `late` has parameters, so its state exists from the start; measure a leaf target added later
    outs = {}
    for step in range(6):
        model.use_late = step >= 2
        xs = [torch.randn(3, 4) for _ in range(2)]
        outs[step] = [nn.functional.linear(x, model.a.weight, model.a.bias).detach() for x in xs]
        for x in xs:
            model(x)
        if step >= 4:
            mon.measure(hookstats.TargetKey("extra", "output"), torch.full((5,), float(step)))
        mon.step()
    mon.remove()
    got = by_step(mon)
    for step in range(6):
        check_step(got[(step, "a:output")], outs[step], mon.cfg)
    assert (1, "late:output") not in got and (2, "late:output") in got
    assert [got[(s, "extra:output")]["mean"] for s in (4, 5)] == [4.0, 5.0]
    assert (3, "extra:output") not in got


def test_no_host_read_inside_training_steps():
    model = Recorder()
    mon = hookstats.attach(model, history=True, log_every=1000)
    run(model, mon, 2)  # states exist
    with no_host_sync() as ops:
        run(model, mon, 5)
    assert any("sub" in op for op in ops)  # the ring was written inside the guarded steps
    mon.remove()
    assert len({s for s, _ in mon.history_sink.items()}) == 7


def test_device_memory_does_not_grow_with_run_length_and_one_copy_per_flush(monkeypatch):
    from hookstats import history as hist_mod
    copies = []
    orig = hist_mod.Ring.start_copy
    monkeypatch.setattr(hist_mod.Ring, "start_copy", lambda self: copies.append(1) or orig(self))
    model = Recorder()
    mon = hookstats.attach(model, history=True, log_every=5)
    run(model, mon, 6)
    first = mon.memory()
    run(model, mon, 40)
    device = ("state_bytes", "history_bytes", "host_staging_bytes", "device_bytes")
    assert {k: mon.memory()[k] for k in device} == {k: first[k] for k in device}
    # the byte counts from the layout alone: per state 5 float64 + istate int64 (no scratch on CPU), one
    # flag byte per device and phase (train, eval); the ring: the alert rows [T, 11] int64 and log_every slots of
    # [T, 5 + c + 1] int64 with c the compact counts and the step's own amax
    # (count, near-zero, NaN/+Inf/-Inf: at defaults no linear bins, no log2 slots, no float buckets), plus [T, 5]
    # float64 (the open step, the closed steps, the carry over a reset), [T, c] int64 (current, previous) and
    # [T, 4096] int64 rows of the float buckets: the baseline and one row of growth (hist_every 5 following
    # log_every: a window of 5 steps holds one histogram step past the ramp); the host staging: one ring copy and
    # the growth row
    isz, t_states, t_ring = mon.cfg.istate_size, len(mon.states(reached_only=False)), len(next(iter(mon.step_history.rings.values())).states)
    assert isz == 2 + 3 + 4096  # count, near-zero, NaN/+Inf/-Inf, the float buckets
    # + every state's closed steps (validation is recorded too, so the eval states keep theirs), + the CPU's flags
    assert first["state_bytes"] == t_states * (5 + isz) * 8 + t_states * 5 * 8 + 2
    c = 2 + 3
    ring = t_ring * 11 * 8 + 5 * t_ring * (5 + c + 1) * 8
    row = t_ring * 4096 * 8
    assert first["history_bytes"] == ring + 2 * t_ring * (5 + c) * 8 + t_ring * 5 * 8 + 2 * row
    assert first["host_staging_bytes"] == ring + row
    # steps 0..44 ended: flushes after steps 4, 9, ..., 44, and the ramp's histogram steps 1, 2 and 4 each found
    # the one growth row full and copied the steps before them early
    assert len(copies) == 9 + 3
    mon.remove()


@pytest.mark.parametrize("log_every,rows", [(10, 1), (20, 2), (40, 2)])
def test_the_float_bucket_rows_are_sized_for_the_steady_state(log_every, rows):
    """Besides the baseline, one row of float-bucket growth per histogram step a window holds past the ramp (hist_every
    10: log_every / 10), at most two; the host staging holds the growth rows alone. Against hist_every=log_every (one
    row, whose bytes the test above counts): hist_every changes nothing else a ring holds."""
    def ring_bytes(hist_every):
        model = Recorder()
        mon = hookstats.attach(model, history=True, log_every=log_every, hist_every=hist_every)
        run(model, mon, 2)  # step 0 ends (the ring is made) when step 1 begins
        m = mon.memory()
        t = len(next(iter(mon.step_history.rings.values())).states)
        mon.remove()
        return m["history_bytes"], m["host_staging_bytes"], t

    (dev, host, t), (dev1, host1, _) = ring_bytes(10), ring_bytes(log_every)
    assert dev - dev1 == host - host1 == (rows - 1) * t * 4096 * 8


def test_history_without_pandas_is_plain_lists(monkeypatch):
    model = Recorder()
    mon = hookstats.attach(model, history=True)
    run(model, mon, 3)
    monkeypatch.setitem(sys.modules, "pandas", None)
    cols = mon.history()
    assert set(cols) == {"step", "target", "kind", "phase", "stat", "value"}
    assert len({len(v) for v in cols.values()}) == 1
    rows = list(zip(cols["step"], cols["target"], cols["stat"]))
    i = rows.index((1, "a:output", "mean"))
    assert cols["value"][i] == pytest.approx(model.seen[1]["a:output"].double().mean().item(), rel=1e-6)
    mon.remove()


def test_history_frame_is_long_format():
    model = Recorder()
    mon = hookstats.attach(model, history=True)
    run(model, mon, 3)
    df = mon.history()
    assert list(df.columns) == ["step", "target", "kind", "phase", "stat", "value"]
    assert sorted(df.step.unique()) == [0, 1]  # step 2 is still open
    v = df[(df.step == 1) & (df.target == "b:output") & (df.stat == "std")].value.item()
    assert v == pytest.approx(model.seen[1]["b:output"].double().std().item(), rel=1e-6)
    mon.remove()


def test_keep_bounds_the_host_copy_but_sinks_get_every_step():
    model = Recorder()
    extra = MemorySink()
    mon = hookstats.attach(model, history=True, log_every=2, keep=3, sinks=[extra])
    run(model, mon, 9)
    mon.remove()
    assert [s for s, _ in mon.history_sink.steps] == [6, 7, 8]
    assert [s for s, _ in extra.steps] == list(range(9))


def test_step_moments_stay_exact_after_a_long_drifting_run():
    # The running variance of a drifting run dwarfs a quiet step's: a step derived by subtracting running
    # totals loses it (2000 steps, mean 0 -> 1000, step std 1e-4: relative error >> 1); the open step's own
    # state does not.
    model = nn.Linear(1, 1).double()
    with torch.no_grad():
        model.weight.fill_(1.0)
        model.bias.zero_()
    mon = hookstats.attach(model, steps="manual", history=2500, log_every=500, alerts=False)
    g = torch.Generator().manual_seed(0)
    xs = [torch.full((64, 1), 0.5 * s, dtype=torch.float64) + 1e-4 * torch.randn(64, 1, generator=g,
                                                                                 dtype=torch.float64)
          for s in range(2000)]
    with torch.no_grad():
        for x in xs:
            model(x)
            mon.step()
    mon.remove()  # flushes the last steps
    got = by_step(mon)  # the last 1000 steps are kept on the host
    for s in (1000, 1001, 1500, 1998, 1999):
        rec = got[(s, "Linear:output")]
        want = xs[s].numpy().ravel()
        assert rec["count"] == 64
        assert rec["mean"] == pytest.approx(want.mean(), rel=1e-12, abs=1e-12)
        assert rec["std"] == pytest.approx(want.std(ddof=1), rel=1e-6), s
    total = mon.stats()["Linear:output"]  # and the running totals are still the whole run's
    allx = torch.cat(xs).numpy().ravel()
    assert total["count"] == allx.size and total["mean"] == pytest.approx(allx.mean(), rel=1e-12)
    assert total["std"] == pytest.approx(allx.std(ddof=1), rel=1e-9)


def test_a_failing_sink_is_dropped_with_a_warning_and_training_goes_on():
    class Broken:
        def write(self, step, records):
            raise OSError("disk full")

        def close(self):
            pass

    model = Recorder()
    good = MemorySink()
    mon = hookstats.attach(model, history=True, log_every=2, sinks=[Broken(), good])
    with pytest.warns(HistoryWarning, match="Broken failed and was dropped.*disk full") as caught:
        run(model, mon, 5)
    mon.remove()
    assert [s for s, _ in good.steps] == list(range(5))
    assert [w.filename for w in caught] == [__file__]  # the user's line (run() here), not hookstats'


def test_histogram_and_bad_arguments():
    model = Recorder()
    mon = hookstats.attach(model, linear_hist=True, hist_every=1)
    run(model, mon, 2)
    h = mon.histogram("a:output")
    want = finalize(*combine_all([oracle(s["a:output"], mon.cfg) for s in model.seen]), mon.cfg)
    assert h["hist"] is not None and h["float_hist"] is not None
    np.testing.assert_array_equal(h["hist"], want["hist"])
    np.testing.assert_array_equal(h["log2_hist"], want["log2_hist"])
    np.testing.assert_array_equal(h["float_hist"], float_counts(torch.cat([s["a:output"].reshape(-1) for s in model.seen])))
    with pytest.raises(KeyError, match="no target 'nope'"):
        mon.histogram("nope")
    with pytest.raises(RuntimeError, match="history=True"):
        mon.history()
    for kwargs, match in (({"history": True, "log_every": 0}, "log_every must be an int >= 1"),
                          ({"history": 0}, "history must be an int >= 1"),
                          ({"sinks": [object()]}, "write\\(step, records\\) and close\\(\\)"),
                          ({"history": True, "alerts": "yes"}, "alerts must be")):
        with pytest.raises(ValueError, match=match):
            hookstats.attach(model, **kwargs)
    assert len(model.b._forward_hooks) == 1  # only `mon`'s: the failed attaches removed theirs
    mon.remove()


def random_states(rng, shape, cfg):
    """Ring-layout states [*shape, 5] float64 and [*shape, istate] int64: empty ones, one finite value, many,
    NaN/Inf counted, moments overflowing to inf or NaN, near-zero fractions, histograms of any fill."""
    size = int(np.prod(shape))
    f = np.empty((size, 5))
    i = rng.integers(0, 50, (size, cfg.istate_size)) * (rng.random((size, 1)) < 0.8)
    n = rng.choice([0, 1, 2, 3, 10**6, 2**40], size)
    f[:, 0] = n
    f[:, 1] = rng.choice([0.0, -3.5, 1e300, np.inf, -np.inf, np.nan], size) * rng.random(size)
    f[:, 2] = rng.choice([0.0, 1.0, 1e308, np.inf, np.nan], size) * rng.random(size)
    lo = rng.normal(size=size) * rng.choice([1.0, 1e300, np.inf], size)
    f[:, 3], f[:, 4] = lo, lo + rng.random(size)
    f[n == 0, 1:] = empty(numpy=True)[1:]
    i[:, 0] = np.where(rng.random(size) < 0.2, 0, n + rng.integers(0, 5, size))  # count >= finite, or empty
    i[:, 1] = rng.integers(0, i[:, 0] + 1)
    return f.reshape(*shape, 5), i.reshape(*shape, cfg.istate_size)


def same_value(got, want):
    """Bit for bit and of the same Python type (NaN equal to NaN)."""
    if isinstance(want, np.ndarray):
        return isinstance(got, np.ndarray) and got.dtype == want.dtype and np.array_equal(got, want, equal_nan=True)
    if isinstance(want, float) and np.isnan(want):
        return type(got) is float and np.isnan(got)
    return type(got) is type(want) and got == want


# the kernel's own histograms (float buckets off), then the defaults (float buckets, no linear bins)
KERNEL_CONFIGS = [{"linear_hist": True, "float_hist": False}, {"nbins": 7, "log_hist": False, "float_hist": False},
                  {"linear_hist": False, "float_hist": False}]
CONFIGS = KERNEL_CONFIGS + [{}]


def known_tensor(rng, case, cfg):
    """float32 data of one of six shapes: empty, values at the linear bins' centres with values below and
    above the range, zeros and tiny ones, all NaN, a single value, NaN/Inf among normal values, wide normals."""
    edges = np.linspace(cfg.lo, cfg.hi, cfg.nbins + 1)
    centres = (edges[:-1] + edges[1:]) / 2
    if case == 0:
        v = np.zeros(0)
    elif case == 1:
        v = np.concatenate([rng.choice(centres, 30), [cfg.lo - 3.0, cfg.hi + 1.5, cfg.hi * 4, 0.0, 0.0, 1e-40, 5e-7]])
    elif case == 2:
        v = np.full(5, np.nan)
    elif case == 3:
        v = np.array([rng.choice(centres)])
    elif case == 4:
        v = np.concatenate([rng.normal(size=20), [np.nan, np.inf, -np.inf, np.inf]])
    else:
        v = rng.normal(size=50) * 10.0 ** rng.integers(-30, 30, 50)
    return torch.tensor(rng.permutation(v), dtype=torch.float32)


def numpy_statistics(x, cfg):
    """The statistics of tensor x in NumPy float64, straight from its values (what finalize must give)."""
    v = x.double().numpy()
    fin = v[np.isfinite(v)]
    n = fin.size
    out = {"count": v.size, "finite": n, "mean": fin.mean() if n else np.nan,
           "std": np.std(fin, ddof=1) if n > 1 else np.nan, "var": np.var(fin, ddof=1) if n > 1 else np.nan,
           "min": fin.min() if n else np.nan, "max": fin.max() if n else np.nan,
           "near_zero": (np.abs(v) <= np.float32(cfg.eps)).sum() / v.size if v.size else np.nan,
           "near_zero_count": (np.abs(v) <= np.float32(cfg.eps)).sum(),
           "nan": np.isnan(v).sum(), "posinf": np.isposinf(v).sum(), "neginf": np.isneginf(v).sum(),
           "rms": np.sqrt(np.mean(fin * fin)) if n else np.nan, "l2": np.linalg.norm(fin) if n else np.nan}
    if cfg.linear_hist:  # the bin of x: floor((x - lo) * nbins / (hi - lo)) in float32, as StatsConfig says
        pos = (fin.astype(np.float32) - np.float32(cfg.lo)) * np.float32(cfg.nbins / (cfg.hi - cfg.lo))
        inside = (pos >= 0) & (pos < cfg.nbins)
        out.update(underflow=(pos < 0).sum(), overflow=(pos >= cfg.nbins).sum(),
                   hist=np.bincount(np.floor(pos[inside]).astype(np.int64), minlength=cfg.nbins),
                   hist_edges=np.linspace(cfg.lo, cfg.hi, cfg.nbins + 1))
    if cfg.log_hist:
        a = np.abs(fin)
        with np.errstate(divide="ignore"):
            slot = np.where(a == 0, 0, np.where(a < 2.0 ** -126, 1, np.floor(np.log2(a)) + 128)).astype(np.int64)
        out["log2_hist"] = np.bincount(slot, minlength=256)
    return out


def state_statistics(f, i, cfg):
    """The statistics of one state in plain Python float64 from its fields (NaN where undefined)."""
    n, mean, m2, lo, hi = (float(x) for x in f)
    count, nz = int(i[0]), int(i[1])
    lin = i[2: 2 + (cfg.nbins + 2 if cfg.linear_hist else 0) + 3]  # [under, bins, over], NaN, +Inf, -Inf
    overflow = m2 == math.inf  # M2 past float64's range: var, std, rms and l2 unknown
    m2k = math.nan if overflow else m2
    var = m2k / (n - 1) if n > 1 else math.nan
    if n <= 0 or math.isnan(m2k) or math.isnan(mean):
        rms = math.nan
    else:  # sqrt(mean^2 + M2 / n), scaled by the larger term so that neither square overflows
        big = max(abs(mean), math.sqrt(m2k / n))
        rms = big if big in (0.0, math.inf) else big * math.sqrt((mean / big) ** 2 + (m2k / n) / big / big)
    out = {"count": count, "finite": int(n), "mean": mean if n > 0 else math.nan,
           "std": math.sqrt(var) if n > 1 else math.nan, "var": var, "min": lo, "max": hi,
           "rms": rms, "l2": math.sqrt(n) * rms, "moments_overflow": int(overflow),
           "near_zero": nz / count if count else math.nan, "near_zero_count": nz,
           "nan": int(lin[-3]), "posinf": int(lin[-2]), "neginf": int(lin[-1])}
    if cfg.linear_hist:
        # floats: NaN where the bins hold nothing though finite values were measured (no histogram step spanned)
        unknown = n > 0 and not lin[: cfg.nbins + 2].any()
        out.update(underflow=math.nan if unknown else float(lin[0]), overflow=math.nan if unknown else float(lin[-4]))
    return out


@pytest.mark.parametrize("config", CONFIGS)
def test_finalize_against_numpy_statistics_of_the_data(config):
    """States of known data (built by the test's own NumPy oracle of the op) give, through finalize_rows
    (many at once) and finalize (one), the statistics NumPy computes from the data itself."""
    from hookstats.config import StatsConfig
    from hookstats.records import finalize_rows
    cfg = StatsConfig(**config)
    rng = np.random.default_rng(len(config))
    data = [[known_tensor(rng, (s + t) % 6, cfg) for t in range(8)] for s in range(6)]
    states = [[oracle(x, cfg) for x in row] for row in data]
    f = np.stack([[st[0] for st in row] for row in states])
    i = np.stack([[st[1] for st in row] for row in states])
    rows = finalize_rows(f, i, cfg)
    assert (rows["hist"] is None) != cfg.linear_hist and (rows["log2_hist"] is None) != cfg.log_hist
    for s, row in enumerate(data):
        for t, x in enumerate(row):
            want = numpy_statistics(x, cfg)
            one = finalize(f[s, t], i[s, t], cfg)
            for k, w in want.items():
                got = rows[k] if k == "hist_edges" else rows[k][s, t]
                for g in (got, one[k]):
                    if isinstance(w, np.ndarray):
                        np.testing.assert_allclose(g, w, rtol=1e-6, err_msg=f"{s},{t} {k}")
                    else:
                        np.testing.assert_allclose(g, w, rtol=1e-12, err_msg=f"{s},{t} {k}")
                assert isinstance(one[k], np.ndarray if isinstance(w, np.ndarray) else
                                  float if k in ("mean", "std", "var", "min", "max", "near_zero", "underflow", "overflow", "rms", "l2")
                                  else int), k  # underflow/overflow: NaN on history steps without histograms


@pytest.mark.parametrize("config", CONFIGS)
def test_finalize_rows_of_odd_states_against_float64_formulas(config):
    """Any state (empty, one value, moments overflowed to inf or NaN, counts of every size) gives the
    statistics of its fields: n - 1 variance, NaN where a statistic is undefined, histograms as stored."""
    from hookstats.config import StatsConfig
    from hookstats.records import finalize_rows
    cfg = StatsConfig(**config)
    f, i = random_states(np.random.default_rng(len(config)), (40, 50), cfg)
    rows = finalize_rows(f, i, cfg)
    end = 2 + (cfg.nbins + 2 if cfg.linear_hist else 0) + 3  # count, near-zero, [under, bins, over], NaN/Inf
    lin, log2 = i[..., 2: end], i[..., end: end + 256]
    for s in range(40):
        for t in range(50):
            for k, w in state_statistics(f[s, t], i[s, t], cfg).items():
                g = rows[k][s, t].item()
                near = k in ("rms", "l2") and math.isclose(g, w, rel_tol=4e-16)  # hypot rounds once more or less
                assert same_value(g, w) or near, (s, t, k, rows[k][s, t], w)
    if cfg.linear_hist:
        assert np.array_equal(rows["hist"], lin[..., 1: cfg.nbins + 1])
    if cfg.log_hist and not cfg.float_hist:  # with float buckets: summed from them (tests/test_buckets.py)
        assert np.array_equal(rows["log2_hist"], log2)


def test_alerts_device_statistics_against_float64_formulas():
    """What the alert rules read on the device (statistics.ALERTED, torch) is the statistics of the fields."""
    from hookstats import statistics
    from hookstats.config import StatsConfig
    cfg = StatsConfig(nbins=5)
    f, i = random_states(np.random.default_rng(3), (300,), cfg)
    got = statistics.derive(statistics.ALERTED, torch.from_numpy(f), torch.from_numpy(i), cfg)
    assert set(got) == {"std", "near_zero", "nonfinite"}
    for t in range(300):
        want = state_statistics(f[t], i[t], cfg)
        want["nonfinite"] = want["nan"] + want["posinf"] + want["neginf"]
        assert got["nonfinite"][t].item() == want["nonfinite"]
        for k in ("std", "near_zero"):  # torch's sqrt may differ from math.sqrt in the last bit
            np.testing.assert_allclose(got[k][t].item(), want[k], rtol=1e-15, err_msg=f"{t} {k}")


@pytest.mark.parametrize("config", KERNEL_CONFIGS)  # with float buckets: test_float_buckets_once_per_flush_window
def test_records_handed_to_sinks_are_finalize_per_target(config):
    from hookstats.config import StatsConfig
    from hookstats.records import step_columns, step_records
    from hookstats import TargetKey
    cfg = StatsConfig(**config)
    f, i = random_states(np.random.default_rng(7), (6, 30), cfg)
    keys = [TargetKey(f"m{t}", "output", leaf=str(t % 3)) for t in range(30)]
    with np.errstate(all="ignore"):
        cols = step_columns(f, i, cfg)
    present = i[..., 0] != 0
    for s, records in enumerate(step_records(keys, cols, present)):
        assert [r["target"] for r in records] == [keys[t].id for t in np.flatnonzero(present[s])]
        for rec, t in zip(records, np.flatnonzero(present[s])):
            # the oracle: finalize, min/max renamed as running values (both NaN while empty), keys first
            want = finalize(f[s, t], i[s, t], cfg)
            lo, hi = want.pop("min"), want.pop("max")
            want.update(running_min=lo, running_max=np.nan if np.isnan(lo) else hi)
            want = {"target": keys[t].id, "module": keys[t].module, "kind": "output", "leaf": keys[t].leaf,
                    "phase": "train", **want}
            assert list(rec) == list(want)
            bad = [k for k in want if not same_value(rec[k], want[k])]
            assert not bad, (s, t, bad)
        if records and cfg.linear_hist:  # each record owns its arrays
            assert not np.shares_memory(records[0]["hist"], i) and records[0]["hist_edges"] is not cols["hist_edges"]


def test_no_record_dicts_without_a_sink_that_takes_them(monkeypatch):
    from hookstats import delivery as hist_mod

    def fail(*args):
        raise AssertionError("records built for MemorySink alone")
    monkeypatch.setattr(hist_mod, "step_records", fail)
    model = Recorder()
    mon = hookstats.attach(model, history=True, log_every=2, sinks=[MemorySink(max_steps=3)])
    run(model, mon, 5)
    mon.remove()
    assert len({s for s, _ in mon.history_sink.items()}) == 5


def test_numpy_scalars_are_taken_wherever_python_ones_are():
    """attach() takes NumPy ints and strings as it takes Python ones (they come from configs and arrays):
    the ring holds `history` slots, flushes every `log_every` steps and the host keeps the last `keep`."""
    torch.manual_seed(0)
    model, sink = nn.Sequential(nn.Linear(3, 3)), MemorySink()
    mon = hookstats.attach(model, steps="manual", history=np.int64(4), log_every=np.int32(3), keep=np.int64(5),
                           every=np.int16(1), near_zero=np.str_("le"), sinks=[sink],
                           alerts=hookstats.AlertRules(dead_steps=np.int64(2), warmup=np.int8(3),
                                                       dead_fraction=np.float32(0.9), enabled=np.bool_(True)))
    xs = [torch.randn(2, 3) for _ in range(7)]
    for s, x in enumerate(xs):
        with torch.no_grad():
            model(x)
        mon.step()
        if s == 2:  # log_every=3: the first three steps are on the host, without a flush of ours
            assert [s for s, _ in sink.steps] == [0, 1, 2]
    mon.flush()
    h = mon.history()
    steps = sorted(set(h["step"]))
    assert steps == [2, 3, 4, 5, 6]  # keep=5: the last five of seven
    mean = h[(h["target"] == "0:output") & (h["stat"] == "mean")].sort_values("step")["value"].to_numpy()
    want = [model[0](x).double().mean().item() for x in xs[2:]]
    np.testing.assert_allclose(mean, want, rtol=1e-6)
    assert mon.cfg.near_zero == "le" and type(mon.cfg.near_zero) is str
    mon.remove()


def test_numpy_bool_history_is_history_true():
    mon = hookstats.attach(nn.Linear(2, 2), steps="manual", history=np.bool_(True), log_every=1)
    mon.model(torch.ones(1, 2))
    mon.step()
    assert sorted(set(mon.history()["step"])) == [0]
    mon.remove()


@pytest.mark.parametrize("kwargs, match", [
    ({"history": True, "log_every": np.int64(0)}, "log_every must be an int >= 1, got 0"),
    ({"history": np.int64(0)}, "history must be an int >= 1, got 0"),
    ({"history": True, "keep": np.int64(-1)}, "keep must be an int >= 1, got -1"),
    ({"near_zero": np.str_("lt")}, "near_zero must be one of 'abs', 'le'; got 'lt'"),
])
def test_bad_numpy_scalars_get_one_error_naming_the_attach_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        hookstats.attach(nn.Linear(2, 2), **kwargs)


def test_history_read_mid_run_has_every_finished_step_and_the_steps_go_on():
    """An eager loop (steps counted by train forwards) with an optimizer: history() read after the optimizer step
    of step k holds steps 0..k, each equal to the oracle of that step's tensors; the run goes on with step k + 1
    (one forward a step, not a step ended twice), and a read before the optimizer step leaves the open step out."""
    model = Recorder()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = hookstats.attach(model, history=True, log_every=10, grads=False, **PER_STEP)

    def train(n):
        for _ in range(n):
            model(torch.randn(4, 6)).square().mean().backward()
            opt.step()
            opt.zero_grad()

    def read():
        frame = mon.history()
        return sorted(set(frame["step"]))

    train(3)
    assert read() == [0, 1, 2]
    train(2)
    assert read() == [0, 1, 2, 3, 4]
    model(torch.randn(4, 6)).square().mean().backward()  # step 5: no optimizer step yet
    assert read() == [0, 1, 2, 3, 4]
    opt.step()
    assert read() == [0, 1, 2, 3, 4, 5]
    mon.remove()
    got = by_step(mon)
    assert sorted({s for s, _ in got}) == list(range(6))
    for step, seen in enumerate(model.seen):
        for target, t in seen.items():
            check_step(got[(step, target)], [t], mon.cfg)
