"""A figure of the histograms (quantiles, near_zero_rel, hist_count, ...) is written at the step that counted it:
in the history and in the JSONL, CSV and TensorBoard files, each such figure equals NumPy's on the values of the
step it is written at, measured by the test's own float64 hooks. Steps of very different scales make a figure
of another step plain."""
import math

import numpy as np
import pytest
import torch
from torch import nn

import hookstats
from hookstats.sinks import CSVSink, JSONLSink
from hookstats.sinks.csv import read_csv
from hookstats.sinks.jsonl import read_jsonl

STEPS = range(10, 40)  # hist_every=10 from step 10: one histogram step (10, 20, 30) in each window of 10
TOL = 0.15  # the float buckets' resolution: 3 mantissa bits


def run(tmp_path, sinks):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64))
    own = {}
    model[0].register_forward_hook(lambda m, i, o: own.__setitem__(step[0], o.detach().double().numpy().ravel()))
    step = [None]
    with hookstats.attach(model, history=True, log_every=10, hist_every=10, start_step=STEPS[0], sinks=sinks,
                         alerts=False) as mon:
        for s in STEPS:
            step[0] = s
            model(torch.randn(32, 8) * 8.0 ** (s % 10)).sum().backward()
        frame = mon.history()
    return own, frame


def check(figures, own):
    """figures: {step: (abs_p50, hist_count)} of the output target, NaN where the step carries none."""
    written = {s: v for s, v in figures.items() if not math.isnan(v[0])}
    assert sorted(written) == [10, 20, 30], sorted(written)
    for s, (p50, count) in written.items():
        assert count == own[s].size, (s, count)
        want = np.quantile(np.abs(own[s]), 0.5)
        assert abs(p50 - want) <= TOL * want, (s, p50, want)


def from_records(pairs):
    return {s: (r.get("abs_p50"), r.get("hist_count")) for s, r in pairs if r["kind"] == "output"
            and r.get("phase", "train") == "train"}


def test_the_history_writes_histogram_figures_at_the_step_that_counted_them(tmp_path):
    own, frame = run(tmp_path, None)
    rows = {(s, st): v for s, t, st, v in zip(frame["step"], frame["target"], frame["stat"], frame["value"])
            if t == "0:output"}
    check({s: (rows.get((s, "abs_p50"), math.nan), rows.get((s, "hist_count"), math.nan)) for s in STEPS}, own)


def test_the_jsonl_and_csv_files_write_histogram_figures_at_the_step_that_counted_them(tmp_path):
    own, _ = run(tmp_path, [JSONLSink(tmp_path / "h.jsonl"), CSVSink(tmp_path / "h.csv")])
    jsonl = from_records(read_jsonl(tmp_path / "h.jsonl")[0])
    check({s: tuple(math.nan if v is None else v for v in fig) for s, fig in jsonl.items()}, own)
    csv = from_records(read_csv(tmp_path / "h.csv")[0])
    check({s: tuple(math.nan if v is None else v for v in fig) for s, fig in csv.items()}, own)


def test_tensorboard_writes_histogram_figures_at_the_step_that_counted_them(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from hookstats.sinks import TensorBoardSink
    own, _ = run(tmp_path, [TensorBoardSink(tmp_path / "tb", stats=("abs_p50", "hist_count"))])
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    tags = {t.rsplit("/", 1)[1]: t for t in acc.Tags()["scalars"] if "/0/output/" in t}
    p50 = {e.step: e.value for e in acc.Scalars(tags["abs_p50"])}
    count = {e.step: e.value for e in acc.Scalars(tags["hist_count"])}
    check({s: (p50.get(s, math.nan), count.get(s, math.nan)) for s in STEPS}, own)
