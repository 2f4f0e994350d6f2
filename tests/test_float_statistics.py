"""The statistics derived from the float buckets (hookstats/statistics.py rows: quantiles of x and |x|, the
relative near-zero figure, the log2 histogram) in stats() and the history, against NumPy of the measured
tensors: numpy.quantile (inverted_cdf), the float_oracle's buckets, np.frexp for the log2 slots."""
import math

import numpy as np
import pytest
import torch
from float_oracle import float_counts
from torch import nn

import hookstats

QS = {"p0_1": 0.001, "p1": 0.01, "p50": 0.5, "p99": 0.99, "p99_9": 0.999}
REL, ABS = 1 / 8, 2.0 ** -129  # the error bound stated in hookstats/buckets.py


def model_and_outputs(seed=0):
    """A small model, and a forward hook of the test's own keeping each output (float64 copies) per call."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 5))
    seen = {}
    for name, m in model.named_children():
        m.register_forward_hook(lambda m, i, o, name=name: seen.setdefault(name, []).append(
            o.detach().double().numpy().ravel().copy()))
    return model, seen


def assert_quantiles(rec, values):
    a = np.abs(values)
    for name, q in QS.items():
        for key, v in ((name, values), ("abs_" + name, a)):
            want = np.quantile(v, q, method="inverted_cdf")
            assert abs(rec[key] - want) <= max(REL * abs(want), ABS), (key, rec[key], want)


def near_zero_rel_oracle(values):
    a = np.abs(values)
    p99 = np.quantile(a, 0.99, method="inverted_cdf")
    if p99 == 0:
        return np.mean(a == 0), 0.0
    t = 2.0 ** (math.floor(math.log2(p99)) - 10)
    return np.mean(a < t), t


def log2_oracle(values):
    a = np.abs(values.astype(np.float32).astype(np.float64))
    out = np.zeros(256, dtype=np.int64)
    out[0] = (a == 0).sum()
    nz = a[a > 0]
    out[1] = (nz < 2.0 ** -126).sum()
    _, e = np.frexp(nz[nz >= 2.0 ** -126])  # |x| in [2**(e-1), 2**e): slot 2 + (e - 1 + 126)
    np.add.at(out, e + 127, 1)
    return out


def test_stats_records_have_quantiles_relative_near_zero_and_log2_from_the_buckets():
    model, seen = model_and_outputs()
    mon = hookstats.attach(model, float_hist=True, grads=False, include_paramless=True, hist_every=1)
    for s in range(3):
        model(torch.randn(50, 6) * (1 + s))
    stats = mon.stats()
    for name, outs in seen.items():
        values = np.concatenate(outs)
        rec = stats[f"{name}:output"]
        np.testing.assert_array_equal(rec["float_hist"], float_counts(values.astype(np.float32)))
        np.testing.assert_array_equal(rec["log2_hist"], log2_oracle(values))
        assert_quantiles(rec, values)
        share, t = near_zero_rel_oracle(values.astype(np.float32))
        assert rec["near_zero_rel"] == pytest.approx(share, abs=1e-12)
        assert rec["near_zero_rel_threshold"] == t
    last = np.concatenate(seen["2"])
    assert len(last) == 750  # ranks 1 and n: stats() knows the exact min and max
    assert stats["2:output"]["p0_1"] == last.min() and stats["2:output"]["p99_9"] == last.max()
    assert stats["1:output"]["near_zero_rel"] > 0.3  # a ReLU's zeros: the eps figure says the same here
    mon.remove()


def test_relative_near_zero_sees_what_eps_misses():
    """A gradient-sized tensor: |x| <= 1e-6 calls almost all of it near zero; the relative figure only the
    values 1000x below the tensor's own scale."""
    torch.manual_seed(1)
    lin = nn.Linear(4, 4000)
    x = torch.randn(1, 4)
    with torch.no_grad():
        lin.weight.mul_(1e-7)
        lin.bias.zero_()
        lin.weight[:40] *= 1e-5  # 1% far below the rest
    mon = hookstats.attach(lin, float_hist=True, grads=False)
    with torch.no_grad():
        out = lin(x).numpy().ravel()
    rec = mon.stats()["Linear:output"]
    assert rec["near_zero"] > 0.99
    share, _ = near_zero_rel_oracle(out)
    assert rec["near_zero_rel"] == pytest.approx(share) and 0.005 < share < 0.05
    mon.remove()


def test_history_records_per_step_and_nan_without_buckets():
    model, seen = model_and_outputs(2)
    mon = hookstats.attach(model, float_hist=True, grads=False, include_paramless=True, history=True, log_every=1, hist_every=1,
                           steps="manual")
    for s in range(3):
        model(torch.randn(40, 6) * 10 ** s)
        mon.step()
    mon.flush()
    recs = {(step, r["target"]): r for step, r in mon.history_sink.items()}
    for name, outs in seen.items():
        for step, values in enumerate(outs):
            rec = recs[(step, f"{name}:output")]
            assert rec["float_hist"] is not None  # log_every=1: every step is a flush step
            assert_quantiles(rec, values)
            share, _ = near_zero_rel_oracle(values.astype(np.float32))
            assert rec["near_zero_rel"] == pytest.approx(share, abs=1e-12)
    mon.remove()


def test_a_record_without_buckets_has_nan_quantiles():
    from hookstats import statistics
    from hookstats.config import StatsConfig
    cfg = StatsConfig(float_hist=True)
    f = np.zeros((2, 5))
    f[:, 3:] = np.nan
    i = np.zeros((2, cfg.istate_size), dtype=np.int64)
    i[1, -1] = 3  # three exact zeros (- half's zero slot)
    i[1, 0] = 3
    f[1, :3] = (3, 0, 0)
    with np.errstate(invalid="ignore"):
        cols = statistics.derive_rows(f, i, cfg, statistics.STATS)
    assert all(math.isnan(cols[k][0]) for k in ("p50", "abs_p99", "near_zero_rel", "near_zero_rel_threshold"))
    assert cols["p50"][1] == 0 and cols["near_zero_rel"][1] == 1 and cols["near_zero_rel_threshold"][1] == 0
    with np.errstate(invalid="ignore"):
        off = statistics.derive_rows(f, np.zeros((2, StatsConfig().istate_size), dtype=np.int64),
                                     StatsConfig(float_hist=False, log_hist=True), statistics.STATS)
    assert off["p50"] is None and off["near_zero_rel"] is None
