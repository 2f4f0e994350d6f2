"""statistics.py on its own: each statistic derived from raw state rows built by hand from known values (the
layout's slots filled with NumPy), against NumPy float64; the device path (torch rows, what the alerts read)
gives the same values as the host path."""
import math

import numpy as np
import pytest
import torch

from hookstats import StatsConfig, layout, rawstate, statistics

CFG = StatsConfig(nbins=4, lo=-1, hi=1, eps=0.05, float_hist=False, log_hist=False)
# Each op counter of values v, by its name in rawstate.COUNTERS (one per csrc/state_layout.def row), as NumPy counts it.
COUNTERS = {"count": lambda v, cfg: len(v), "near_zero": lambda v, cfg: (np.abs(v) <= cfg.eps).sum()}


def row(values, cfg=CFG):
    """(fstate, istate) of values, built by hand: moments of the finite ones; the op counters in their rows' order,
    the linear slots (under, bins, over), NaN, +Inf, -Inf."""
    v = np.asarray(values, dtype=np.float64)
    fin = v[np.isfinite(v)]
    mean = fin.mean() if len(fin) else 0.0
    f = [len(fin), mean, ((fin - mean) ** 2).sum(), fin.min() if len(fin) else math.nan,
         fin.max() if len(fin) else math.nan]
    edges = np.linspace(cfg.lo, cfg.hi, cfg.nbins + 1)
    lin = [(fin < cfg.lo).sum(), *np.histogram(fin[(fin >= cfg.lo) & (fin < cfg.hi)], edges)[0], (fin >= cfg.hi).sum()]
    counters = [COUNTERS[name](v, cfg) for name in rawstate.COUNTERS]
    i = [*counters, *lin, np.isnan(v).sum(), (v == math.inf).sum(), (v == -math.inf).sum()]
    assert len(i) == cfg.istate_size
    return np.array(f, dtype=np.float64), np.array(i, dtype=np.int64)


SAMPLES = [
    [0.5, -0.25, 0.01, 3.0, -2.0, 0.0, 0.75],
    [0.3, math.nan, math.inf, -0.9, -math.inf, 0.04],
    [2.5],  # one finite value: var and std are NaN
    [],  # empty: mean, var, std, rms NaN; counts 0
    [math.nan, math.nan],  # nothing finite
]


def rows():
    f, i = zip(*(row(s) for s in SAMPLES))
    return np.stack(f), np.stack(i)


def oracle(values):
    v = np.asarray(values, dtype=np.float64)
    fin = v[np.isfinite(v)]
    n = len(fin)
    return {"count": len(v), "finite": n, "mean": fin.mean() if n else math.nan,
            "var": fin.var(ddof=1) if n > 1 else math.nan, "std": fin.std(ddof=1) if n > 1 else math.nan,
            "rms": math.sqrt((fin ** 2).mean()) if n else math.nan, "l2": np.linalg.norm(fin) if n else math.nan,
            "min": fin.min() if n else math.nan, "max": fin.max() if n else math.nan,
            "near_zero": (np.abs(v) <= 0.05).sum() / len(v) if len(v) else math.nan,
            "near_zero_count": (np.abs(v) <= 0.05).sum(), "nan": np.isnan(v).sum(),
            "posinf": (v == math.inf).sum(), "neginf": (v == -math.inf).sum(),
            "underflow": (fin < -1).sum(), "overflow": (fin >= 1).sum(), "hist_count": n}


@pytest.mark.parametrize("name", ["count", "finite", "mean", "var", "std", "rms", "l2", "min", "max", "near_zero",
                                  "near_zero_count", "nan", "posinf", "neginf", "underflow", "overflow", "hist_count"])
def test_each_statistic_matches_numpy(name):
    f, i = rows()
    with np.errstate(divide="ignore", invalid="ignore"):
        got = statistics.derive_rows(f, i, CFG, statistics.STATS)[name]
    want = [oracle(s)[name] for s in SAMPLES]
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64), rtol=1e-12,
                               equal_nan=True)


def test_the_linear_histogram_and_its_edges():
    f, i = rows()
    with np.errstate(divide="ignore", invalid="ignore"):
        out = statistics.derive_rows(f, i, CFG, statistics.STATS)
    assert out["hist"].tolist() == [[0, 1, 2, 2], [1, 0, 2, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    np.testing.assert_allclose(out["hist_edges"], [-1, -0.5, 0, 0.5, 1])
    assert out["log2_hist"] is None and out["float_hist"] is None  # switched off in this config


def test_history_records_have_running_min_max_instead_of_min_max():
    f, i = rows()
    with np.errstate(divide="ignore", invalid="ignore"):
        out = statistics.derive_rows(f, i, CFG, statistics.HISTORY)
    assert "min" not in out and "max" not in out
    np.testing.assert_allclose(out["running_min"], [oracle(s)["min"] for s in SAMPLES], equal_nan=True)
    np.testing.assert_allclose(out["running_max"], [oracle(s)["max"] for s in SAMPLES], equal_nan=True)


def test_the_device_path_derives_what_the_host_path_does():
    f, i = rows()
    wanted = ["mean", "std", "rms", "l2", "near_zero", "nan", "underflow"]
    with np.errstate(divide="ignore", invalid="ignore"):
        host = statistics.derive(wanted, f, i, CFG)
    dev = statistics.derive(wanted, torch.from_numpy(f), torch.from_numpy(i), CFG)
    for name in wanted:
        np.testing.assert_allclose(dev[name].numpy().astype(np.float64), np.asarray(host[name], dtype=np.float64),
                                   rtol=1e-12, equal_nan=True, err_msg=name)


def test_the_sinks_nonfinite_figure_sums_its_inputs():
    assert statistics.from_record("nonfinite", {"nan": 2, "posinf": 1, "neginf": 4}) == 7
    assert statistics.from_record("nonfinite", {"nan": 2, "posinf": None, "neginf": 4}) is None


def test_the_log2_slots_count_magnitudes_by_binade():
    cfg = StatsConfig(float_hist=False)
    v = np.array([0.0, 1.0, 1.5, 3.0, -0.25, 2.0 ** -130])
    # log2 slots: 0 exact zero, 1 nonzero below 2**-126, 2 + k for |x| in [2**(k - 126), 2**(k - 125))
    slots = np.zeros(256, dtype=np.int64)
    for x in v:
        slots[0 if x == 0 else 1 if abs(x) < 2.0 ** -126 else 2 + int(math.floor(math.log2(abs(x)))) + 126] += 1
    i = np.zeros(cfg.istate_size, dtype=np.int64)
    i[layout.COUNT] = len(v)
    i[layout.log_base(cfg.nbins, cfg.flags):] = slots
    f = np.array([len(v), v.mean(), ((v - v.mean()) ** 2).sum(), v.min(), v.max()])
    out = statistics.derive_rows(f[None], i[None], cfg, statistics.STATS)
    assert out["log2_hist"][0].tolist() == slots.tolist() and out["hist_count"][0] == len(v)
