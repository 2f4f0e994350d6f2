"""log_hist=False with the float buckets on: no log2 histogram anywhere (stats(), mon.histogram(), the
history's records, a sink's records, JSONL and its reading back, TensorBoard, the charts), while the buckets
stay; log_hist=True: the log2 histogram everywhere, against np.frexp of the measured outputs."""
import json

import numpy as np
import pytest
import torch
from test_float_statistics import log2_oracle
from test_memory_sink import Keep
from test_sinks import tb_events
from torch import nn

import hookstats
from hookstats.tools import plots
from hookstats.sinks import JSONLSink, TensorBoardSink, read_jsonl

TARGET = "0:output"


def train(tmp_path, log_hist, steps=4):
    """Outputs of layer 0 per step (a hook of the test's own), and the monitor (history, log_every=2)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 40), nn.ReLU(), nn.Linear(40, 3))
    seen = []
    model[0].register_forward_hook(lambda m, i, o: seen.append(o.detach().double().numpy().ravel().copy()))
    keep = Keep()
    # hist_every=1: every step counts its buckets, and its record carries them
    mon = hookstats.attach(model, steps="manual", history=True, log_every=2, grads=False, log_hist=log_hist, hist_every=1,
                           sinks=[keep, JSONLSink(tmp_path / "h.jsonl"), TensorBoardSink(tmp_path / "tb")])
    for s in range(steps):
        with torch.no_grad():
            model(torch.randn(8, 5) * 10.0 ** (s - 2))
        mon.step()
    mon.remove()
    return mon, keep, seen


def windows(seen, records):
    """{step: the outputs its record's buckets cover}: the steps since the previous record with buckets (each
    histogram step's own: with hist_every=1 that step alone)."""
    out, start = {}, 0
    for step, rec in records:
        if rec["float_hist"] is not None:
            out[step] = np.concatenate(seen[start: step + 1])
            start = step + 1
    return out


@pytest.mark.parametrize("log_hist", [False, True])
def test_log_hist_switches_the_log2_histogram_everywhere(tmp_path, log_hist):
    mon, keep, seen = train(tmp_path, log_hist)
    every = np.concatenate(seen)
    want_total = log2_oracle(every) if log_hist else None

    def check(got, want):
        if want is None:
            assert got is None
        else:
            np.testing.assert_array_equal(got, want)

    stats = mon.stats()[TARGET]
    check(stats["log2_hist"], want_total)
    check(mon.histogram(TARGET)["log2_hist"], want_total)
    assert stats["float_hist"] is not None and stats["float_hist"].sum() == every.size  # the buckets stay

    kept = [(s, r) for s, recs in keep.steps for r in recs if r["target"] == TARGET]
    history = [(s, r) for s, r in mon.history_sink.items() if r["target"] == TARGET]
    jsonl = [(s, r) for s, r in read_jsonl(tmp_path / "h.jsonl")[0] if r["target"] == TARGET]
    flushes = windows(seen, kept)
    assert sorted(flushes) == [0, 1, 2, 3] and all(len(v) == 8 * 40 for v in flushes.values())
    for records in (kept, history, jsonl):
        assert [s for s, _ in records] == [0, 1, 2, 3]
        for step, rec in records:
            assert (rec.get("float_hist") is None) == (step not in flushes)  # JSONL: absent
            check(rec.get("log2_hist"), log2_oracle(flushes[step]) if log_hist and step in flushes else None)

    lines = [json.loads(line) for line in open(tmp_path / "h.jsonl") if f'"{TARGET}"' in line]
    assert all(("log2_hist" in line and line["log2_hist"] is not None) == (log_hist and "float_hist" in line)
               for line in lines)

    tags = tb_events(tmp_path / "tb").Tags()["histograms"]
    assert (f"hookstats/{TARGET.replace(':', '/')}/log2_abs" in tags) == log_hist
    assert f"hookstats/{TARGET.replace(':', '/')}/hist" in tags  # the view fitted to the buckets

    pytest.importorskip("matplotlib")
    for source in (mon.history_sink, tmp_path / "h.jsonl"):
        series = plots.collect(source)
        assert (series[TARGET]["log2_hist"] is None) != log_hist
        names = {p.name for p in plots.save_all(series, tmp_path / "charts")}
        assert ("hist_log2_output.png" in names) == log_hist
        assert {"hist_linear_output.png", "dynamic_range.png"} <= names  # from the buckets
