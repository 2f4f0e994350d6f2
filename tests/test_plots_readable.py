"""Charts a reader can read: a near-zero share of 0.15 % is not flattened by a 0..100 % axis, 14 targets in one
panel each have their own color/style pair, legend entry and direct label, and a heatmap has one labelled column
per histogram record (40 steps with hist_every=10: 4 columns, each with its step)."""
import numpy as np
import pytest
import torch
from matplotlib.colors import to_rgba
from torch import nn

import hookstats
from hookstats.tools import plots

pytest.importorskip("matplotlib")


def records(n_targets, steps, near_zero_rel):
    """(step, record) pairs as a history holds them; near_zero_rel(t, step) -> a fraction."""
    return [(step, {"target": f"{t}:output", "kind": "output", "mean": 0.01 * t, "std": 1.0 + 0.01 * t,
                    "near_zero": 0.0, "near_zero_rel": near_zero_rel(t, step)})
            for step in range(steps) for t in range(n_targets)]


def near_zero_axis(series):
    fig = plots.plot_layer_stats(series)
    ax = next(a for a in fig.axes if a.get_title().startswith("near zero"))
    return ax, np.concatenate([line.get_ydata() for line in ax.lines])


def test_a_near_zero_share_of_a_tenth_of_a_percent_fills_its_axis():
    s = plots.collect(records(3, 20, lambda t, k: 0.0015 + 0.0002 * np.sin(k + t)))
    ax, y = near_zero_axis(s)
    lo, hi = ax.get_ylim()
    assert lo <= y.min() and y.max() <= hi
    assert hi - lo < 0.5  # percent: the data's ~0.04 % spread fills most of the axis, not 1/2500 of 0..100
    assert (y.max() - y.min()) / (hi - lo) > 0.5


@pytest.mark.parametrize("values, bounds", [(lambda t, k: 0.0, (-1, 1)), (lambda t, k: k / 19, (-2, 102)),
                                            (lambda t, k: 0.5, (40, 60))], ids=["zeros", "0-to-100", "constant"])
def test_the_near_zero_axis_holds_the_data_within_0_to_100(values, bounds):
    ax, y = near_zero_axis(plots.collect(records(2, 20, values)))
    lo, hi = ax.get_ylim()
    assert lo <= y.min() and y.max() <= hi and hi > lo
    assert bounds[0] <= lo and hi <= bounds[1]


@pytest.mark.parametrize("n", [14, 45])
def test_many_targets_have_distinct_lines_a_legend_entry_and_a_direct_label_each(n):
    s = plots.collect(records(n, 5, lambda t, k: 0.001 * t))
    fig = plots.plot_layer_stats(s)
    panels = [a for a in fig.axes if a.lines]
    for ax in panels:
        pairs = [(to_rgba(line.get_color()), line.get_linestyle()) for line in ax.lines]
        assert len(set(pairs[:40])) == min(n, 40)  # 10 colors x 4 styles, then they repeat
        assert sorted(int(t.get_text()) for t in ax.texts) == list(range(n))
    legend = fig.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == [f"{k}  {k}:output" for k in range(n)]
    assert [line.get_label() for line in panels[0].lines] == [f"{k}:output" for k in range(n)]


def test_a_heatmap_has_one_labelled_column_per_histogram_record():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    mon = hookstats.attach(model, history=True, log_every=10, hist_every=10)
    for _ in range(40):
        model(torch.randn(16, 8)).square().mean().backward()
    mon.remove()
    s = plots.collect(mon.history_sink.items())
    steps = s["0:output"]["float_view_steps"]
    assert list(steps) == [0, 1, 2, 4, 8, 10, 20, 30]  # step 0, the ramp, the grid: each histogram step its column
    fig = plots.plot_hist_heatmap(s, hist="linear", kind="output")
    ax = next(a for a in fig.axes if a.get_title() == "0:output")
    img = np.asarray(ax.images[0].get_array())
    assert img.shape[1] == len(steps)
    x0, x1 = ax.images[0].get_extent()[:2]
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(k) for k in steps]
    np.testing.assert_allclose(ax.get_xticks(), x0 + (np.arange(len(steps)) + 0.5) * (x1 - x0) / len(steps))
    assert ax.get_xlabel() == "histogram step"
