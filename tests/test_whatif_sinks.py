"""What the what-if adds to the sinks: the file sinks write its fields only on the records that carry float buckets
(the steps that counted the histograms, hist_every), which bounds how much it grows a file; the dashboards log them only when chosen."""
import csv

import pytest
import torch
from torch import nn

import hookstats
from hookstats import whatif
from hookstats.sinks import DASHBOARD_STATS, CSVSink, Sink


@pytest.mark.parametrize("log_every,hist_every,counted", [(1, 1, [0, 1, 2, 3, 4, 5, 6, 7]), (4, 1, [0, 1, 2, 3, 4, 5, 6, 7]),
                                                           (4, 4, [0, 1, 2, 4])])
def test_csv_has_the_what_if_rows_on_the_steps_with_buckets_only(tmp_path, log_every, hist_every, counted):
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    steps = 8
    with hookstats.attach(model, grads=False, history=True, log_every=log_every, hist_every=hist_every, steps="manual",
                          alerts=False, sinks=[CSVSink(tmp_path / "h.csv")]) as mon:
        for _ in range(steps):
            with torch.no_grad():
                model(torch.randn(3, 4))
            mon.step()
    with open(tmp_path / "h.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["target"]]
    fields = set(whatif.field_names())
    got = sorted({int(r["step"]) for r in rows if r["stat"] in fields})
    assert got == counted  # the histogram steps: 0, the ramp (1, 2 below hist_every), then the grid
    assert sum(r["stat"] in fields for r in rows) == len(fields) * 2 * len(got)  # 2 targets, 24 fields
    assert len(fields) == 24


def test_dashboards_log_the_what_if_only_when_chosen():
    assert not set(whatif.field_names()) & set(DASHBOARD_STATS)
    chosen = Sink(stats=("e4m3_underflow_delayed", "mean"))
    assert chosen.stats == ("e4m3_underflow_delayed", "mean")
    with pytest.raises(ValueError, match="e4m3_underflow_later"):
        Sink(stats=("e4m3_underflow_later",))
