"""Dashboards without holes: a figure of the histograms is written only where the histograms were counted (no NaN
point in TensorBoard, read back with its own reader; no NaN or null field in the CSV/JSONL files; no NaN row in
mon.history()), every logging window holds a histogram step by default (history's log_every, the callbacks'
logging interval), and stats() says which steps its quantiles cover (hist_steps)."""
import json
import math

import numpy as np
import pytest
import torch
from helpers import hist_step
from torch import nn

import hookstats
from hookstats.sinks import CSVSink, JSONLSink, TensorBoardSink
from hookstats.statistics import DASHBOARD_STATS, HIST_FIGURES

STATS = (*DASHBOARD_STATS, "p50", "abs_p99", "hist_count")


def model_and_data(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 20), nn.ReLU(), nn.Linear(20, 3))
    seen = []
    model[0].register_forward_hook(lambda m, i, o: seen.append(o.detach().double().reshape(-1).numpy()))
    return model, seen


@pytest.mark.parametrize("every,log_every,steps", [(1, 10, 30), (1, 4, 19), (2, 6, 25), (1, 3, 8)])
def test_tensorboard_and_files_get_no_nan_and_every_window_its_histogram_figures(tmp_path, every, log_every, steps):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    model, seen = model_and_data()
    sinks = [TensorBoardSink(tmp_path / "tb", stats=STATS), CSVSink(tmp_path / "h.csv"), JSONLSink(tmp_path / "h.jsonl")]
    mon = hookstats.attach(model, every=every, log_every=log_every, sinks=sinks, grads=False, alerts=False)
    for _ in range(steps):
        model(torch.randn(6, 5))
    mon.remove()
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    nan_points = [(t, e.step) for t in acc.Tags()["scalars"] for e in acc.Scalars(t) if math.isnan(e.value)]
    assert nan_points == []
    # each near_zero_rel point is a histogram step, with the figures of its own values: the steps since the
    # previous point hold no other histogram step
    sampled = [k for k in range(steps) if k % every == 0]
    rel = {e.step: e.value for e in acc.Scalars("hookstats/0/output/near_zero_rel")}
    p50 = {e.step: e.value for e in acc.Scalars("hookstats/0/output/p50")}
    assert sorted(p50) == sorted(rel) and max(rel) == max(k for k in sampled if hist_step(k, every, mon.cfg.hist_every))
    windows, start = {}, 0
    for point in sorted(rel):
        windows[point] = [k for k in sampled if start <= k <= point]
        start = point + 1
    for last, ks in windows.items():
        hist = [k for k in ks if hist_step(k, every, mon.cfg.hist_every)]
        assert hist == [last], ks
        values = np.concatenate([seen[k] for k in hist])
        values = values[np.isfinite(values)]
        want = np.quantile(values, 0.5, method="inverted_cdf")
        assert abs(p50[last] - want) <= abs(want) / 8 + 1e-30
    with open(tmp_path / "h.jsonl") as f:
        lines = [json.loads(line) for line in f]
    for line in lines:
        for stat in HIST_FIGURES:
            assert stat not in line or line[stat] is not None, (line["step"], stat)
    assert {line["step"] for line in lines if "near_zero_rel" in line and line["target"] == "0:output"} == set(rel)
    with open(tmp_path / "h.csv") as f:
        rows = [r.rstrip("\n").split(",") for r in f][1:]
    assert not [r for r in rows if r[6] in HIST_FIGURES and r[7] == "nan"]
    frame = mon.history_sink.frame()
    assert not frame[frame.stat.isin(HIST_FIGURES)]["value"].isna().any()
    # stats(): which steps its quantiles cover
    got = mon.stats()["0:output"]["hist_steps"]
    hist_steps = [k for k in sampled if hist_step(k, every, mon.cfg.hist_every)]
    assert {k: got[k] for k in ("count", "first", "last")} == {"count": len(hist_steps), "first": 0,
                                                               "last": hist_steps[-1]}
    assert [k for r in got["steps"] for k in r] == hist_steps


def test_callback_windows_each_hold_a_histogram_step():
    """The HF and Lightning callbacks attach through attach_for_windows with their logging interval: each window of
    stats() then reset() gets the figures of its histograms (none NaN), with hist_steps naming the window's step."""
    from hookstats.integrations.metrics import attach_for_windows, flat_metrics, window_stats
    model, seen = model_and_data()
    for window in (2, 3, 25):
        mon = attach_for_windows(model, window, {"grads": False})
        assert mon.cfg.hist_every == min(window, 10)
        for w in range(3):
            for _ in range(window):
                model(torch.randn(6, 5))
                mon.step()
            stats = window_stats(mon)
            rec = stats["0:output"]
            assert not math.isnan(rec["near_zero_rel"]) and rec["hist_count"] > 0, (window, w)
            assert rec["hist_steps"]["count"] >= 1 and w * window <= rec["hist_steps"]["first"] < (w + 1) * window
            assert "hookstats/0/output/near_zero_rel" in flat_metrics(stats, fields=("near_zero_rel", "p50"))
        mon.remove()


def test_a_window_without_a_histogram_step_logs_no_nan_through_the_callbacks():
    """hist_every asked larger than the window: the windows without a histogram step get no near_zero_rel or
    quantile metric at all (not NaN); the windows with one get them."""
    from hookstats.integrations.metrics import attach_for_windows, flat_metrics, window_stats
    model, _ = model_and_data()
    mon = attach_for_windows(model, 2, {"grads": False, "hist_every": 4})
    got, held = [], []
    for w in range(6):
        for _ in range(2):
            model(torch.randn(6, 5))
            mon.step()
        stats = window_stats(mon)
        covered = stats["0:output"]["hist_steps"]
        held.append(None if covered is None else [k for r in covered["steps"] for k in r])
        got.append(flat_metrics(stats, fields=("mean", "near_zero_rel", "p50")))
    mon.remove()
    want = [[k for k in (2 * w, 2 * w + 1) if hist_step(k, 1, 4)] or None for w in range(6)]
    assert held == want == [[0, 1], [2], [4], None, [8], None]  # the ramp (1, 2), then the grid
    assert all(not math.isnan(v) for m in got for v in m.values())
    assert ["hookstats/0/output/p50" in m for m in got] == [h is not None for h in want]
    assert all("hookstats/0/output/mean" in m for m in got)
