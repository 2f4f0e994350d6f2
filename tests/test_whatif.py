"""The low-precision what-if (hookstats/whatif.py) against tests/cast_oracle.py, a float64 NumPy emulation of the
casts on the same values: exact where the threshold is a bucket edge, within the count of the bucket holding it
otherwise."""
import numpy as np
import pytest
import torch
from torch import nn

import hookstats
from hookstats import buckets, whatif
from cast_oracle import FORMATS, lost, rounded, te_scale
from hookstats.whatif import SIDES
from float_oracle import float_counts, slots_from_bits

TORCH = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "fp16": torch.float16, "bf16": torch.bfloat16}


def _values(dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(20000) * np.exp2(rng.uniform(-40, 20, 20000))
    x = np.concatenate([x, [0.0, -0.0, 448.0, 464.0, 465.0, 61440.0, 2.0 ** -10, 1.875 * 2.0 ** -7, np.nan, np.inf]])
    return torch.from_numpy(x).to(dtype)


def _finite(t):
    v = t.double().numpy()
    return v[np.isfinite(v)]


def _bucket_bound(v, t):
    """The count of the bucket holding threshold t among v's |x| buckets (0 where t is an edge)."""
    if buckets.is_edge(t):
        return 0
    slots = slots_from_bits(np.array([t], dtype=np.float64))[0] % 2048
    return int(np.sum(slots_from_bits(np.abs(v).astype(v.dtype)) % 2048 == slots))


def test_the_oracle_casts_as_torch_does():
    x = _finite(_values(torch.float32)).astype(np.float32)
    for fmt, dt in TORCH.items():
        got = torch.from_numpy(x).to(dt).float().numpy()
        q = rounded(x, fmt)
        _, over = lost(x, 1.0, fmt)
        ok = ~over
        assert np.array_equal(q[ok], np.abs(got[ok])), fmt
        assert np.all(~np.isfinite(got[over]) | (np.abs(got[over]) == FORMATS[fmt][2])), fmt  # Inf/NaN or saturated


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("recipe", ["", "_current", "_delayed"])
def test_shares_match_the_cast_emulation(dtype, recipe):
    t = _values(dtype)
    v = _finite(t)
    n = len(v)
    amax = np.abs(v).max()
    delayed_amax = amax * 37.5  # a past amax larger than this step's
    scale_of = {"": lambda f: 1.0, "_current": lambda f: te_scale(amax, f),
                "_delayed": lambda f: te_scale(delayed_amax, f, margin=2)}[recipe]
    scales = None if recipe == "" else {f: scale_of(f) for f in FORMATS}
    got = whatif.shares(float_counts(t), scales, amax, recipe=recipe)
    for fmt in FORMATS:
        s = scale_of(fmt)
        under, over = lost(v, s, fmt)
        u_t, o_t, _ = whatif.thresholds(fmt)
        for side, want, thr in (("underflow", under, u_t / s), ("overflow", over, o_t / s)):
            err = abs(got[f"{fmt}_{side}{recipe}"] * n - want.sum())
            assert err <= _bucket_bound(v, thr) + 1e-6 * n ** 0, (fmt, side, err)
            if buckets.is_edge(thr):
                assert err < 1e-9, (fmt, side)


def test_the_unscaled_fp8_underflow_and_e5m2_overflow_are_exact():
    exact = [(f, side) for f in FORMATS for side, thr in zip(("underflow", "overflow"), whatif.thresholds(f)[:2])
             if buckets.is_edge(thr)]
    assert exact == [("e4m3", "underflow"), ("e5m2", "underflow"), ("e5m2", "overflow")]


def test_zeros_nan_inf_and_empty():
    t = torch.tensor([0.0, -0.0, float("nan"), float("inf"), 1e-30])
    got = whatif.shares(float_counts(t))
    assert got["e4m3_underflow"] == pytest.approx(1 / 3)  # of the finite values, zeros counted, not lost
    assert got["bf16_underflow"] == 0.0 and got["e4m3_overflow"] == 0.0
    empty = whatif.shares(float_counts(torch.zeros(0)))
    assert all(np.isnan(v) for v in empty.values())


def test_te_scale_follows_transformer_engine():
    assert whatif.te_scale(2.0, "e4m3", margin=1) == (448.0 / 2.0) / 2
    assert whatif.te_scale(0.0, "e4m3") == 1.0 and whatif.te_scale(np.nan, "e5m2") == 1.0


def _run(scales, history_len, margin, log_every=1):
    """A linear layer's outputs (float32) over steps of inputs scaled by `scales` (one step each), and its history
    frame."""
    torch.manual_seed(0)
    model = nn.Linear(16, 16)
    with hookstats.attach(model, history=True, log_every=log_every, hist_every=1, grads=False, steps="manual",
                          amax_history_len=history_len, amax_margin=margin) as mon:
        outs = []
        for s in scales:
            with torch.no_grad():
                outs.append(model(torch.randn(8, 16) * s).numpy().ravel())
            mon.step()
        frame = mon.history()
    return outs, frame


def _te_delayed_amax(outs, history_len):
    """TransformerEngine's amax_compute_algo "max" per step: the largest of the own amaxes of the history_len
    steps before it (NaN for the first step: no history yet)."""
    own = [float(np.abs(o).max()) for o in outs]
    return [max(own[max(0, k - history_len):k]) if k else np.nan for k in range(len(outs))]


@pytest.mark.parametrize("log_every", [1, 3])
def test_delayed_scaling_in_the_history_follows_transformer_engine_with_each_steps_own_amax(log_every):
    scales = [1.0, 1e4, 1.0, 1.0, 1.0, 1.0]  # the large step leaves the window of 2 at step 4
    outs, frame = _run(scales, history_len=2, margin=1, log_every=log_every)
    rows = frame[frame.target == "Linear:output"]
    amax_h = _te_delayed_amax(outs, history_len=2)
    running = np.maximum.accumulate([np.abs(o).max() for o in outs])
    checked = 0
    for step in range(len(scales)):
        got_rows = rows[(rows.step == step) & (rows.stat == "e4m3_underflow_delayed")]
        assert not got_rows.empty, step  # hist_every=1: every step carries its own buckets, whatever log_every
        checked += 1
        values = outs[step]
        for fmt in FORMATS:
            s = te_scale(amax_h[step], fmt, margin=1)
            u_t, o_t, _ = whatif.thresholds(fmt)
            for side, want, thr in zip(SIDES, lost(values, s, fmt), (u_t / s, o_t / s)):
                got = rows[(rows.step == step) & (rows.stat == f"{fmt}_{side}_delayed")].value.item()
                assert abs(got * len(values) - want.sum()) <= _bucket_bound(values, thr) + 1e-9, (step, fmt, side)
        if step >= 4:  # the running amax would scale otherwise: this test tells the two apart
            stale = lost(values, te_scale(running[step - 1], "e4m3", margin=1), "e4m3")[0]
            fresh = lost(values, te_scale(amax_h[step], "e4m3", margin=1), "e4m3")[0]
            assert abs(stale.sum() - fresh.sum()) > _bucket_bound(values, whatif.thresholds("e4m3")[0])
    assert checked == len(scales)
    first = rows[(rows.step == 0) & (rows.stat == "e4m3_underflow_delayed")].value.item()
    assert first == rows[(rows.step == 0) & (rows.stat == "e4m3_underflow")].value.item()  # scale 1 at the start


def test_stats_have_no_delayed_figure_and_bad_arguments_are_refused():
    model = nn.Linear(4, 4)
    with hookstats.attach(model) as mon:
        model(torch.randn(2, 4))
        rec = mon.stats()["Linear:output"]
    assert np.isnan(rec["e4m3_underflow_delayed"]) and not np.isnan(rec["e4m3_underflow_current"])
    for bad in ({"amax_history_len": 0}, {"amax_margin": -1}, {"amax_margin": 0.5}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            hookstats.attach(nn.Linear(2, 2), **bad)


def test_summary_names_the_formats_that_lose_more_than_the_threshold_and_charts_draw(tmp_path):
    model = nn.Sequential(nn.Linear(8, 8, bias=False))
    x = torch.randn(64, 8) * 1e-4
    with hookstats.attach(model, grads=False) as mon:
        with torch.no_grad():
            out = model(x).double().numpy().ravel()
        stats = mon.stats()
        table = hookstats.summary(model, x, lowprec_threshold=0.05, monitor=mon)
    # the oracle: which casts of the layer's output lose more than 5% unscaled (current scaling: none here)
    want = [f for f in FORMATS if sum(m.mean() for m in lost(out, 1.0, f)) > 0.05]
    assert table.rows[0]["loses > 5%"] == ", ".join(want) and "e4m3" in want
    with pytest.raises(ValueError, match="lowprec_threshold"):
        hookstats.summary(model, torch.randn(2, 8), lowprec_threshold=1.5)
    from hookstats.tools.lowprec_plots import plot_lowprec_all
    assert all(p.stat().st_size > 0 for p in plot_lowprec_all(stats, tmp_path))


def test_compiled_model_with_history_has_the_fields():
    model = nn.Linear(8, 8)
    with hookstats.attach(model, history=True, log_every=1, hist_every=1, steps="manual") as mon:
        compiled = torch.compile(model, backend="eager")
        for _ in range(3):
            compiled(torch.randn(4, 8)).sum().backward()
            mon.step()
        frame = mon.history()
        rec = mon.stats()["Linear:output"]
    assert set(whatif.field_names(["", "_delayed"])) <= set(frame.stat)
    assert rec["e5m2_underflow_current"] >= 0
