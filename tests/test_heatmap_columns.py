"""A histogram heatmap has one column per step that counted the histograms, labelled with that step, and each
column is the share of its step's values per bin (so a column holding more values is not brighter), against the
shares computed here from the history's own per-step histograms, and with the float buckets (the default) from the
values the test's own hook saw at each step; a color bar says what the color means."""
import numpy as np
import pytest
import torch
from torch import nn

from test_float_statistics import log2_oracle

import hookstats
from hookstats.tools import plots

pytest.importorskip("matplotlib")

# hist_every=5 over 20 steps: step 0, the ramp 1, 2, 4 below 5, then the grid 5, 10, 15 (concepts: the cadence)
HIST_STEPS = [0, 1, 2, 4, 5, 10, 15]


@pytest.fixture(scope="module")
def run():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    with hookstats.attach(model, history=True, log_every=10, hist_every=5, linear_hist=True, float_hist=False,
                          alerts=False) as mon:
        for step in range(20):
            (model(torch.randn(16, 8) * (1 + step)) ** 2).mean().backward()
    return list(mon.history_sink.items())


def own_shares(items, target, field):
    """{step: share per bin} of the target's records that carry the histogram `field`."""
    out = {}
    for step, rec in items:
        if rec["target"] == target and rec.get("phase", "train") == "train" and rec.get(field) is not None:
            counts = np.asarray(rec[field], dtype=np.float64)
            if counts.sum():
                out[step] = counts / counts.sum()
    return out


def panel(fig, target):
    return next(a for a in fig.axes if a.get_title() == target)


@pytest.mark.parametrize("hist,field", [("linear", "hist"), ("log2", "log2_hist")])
def test_one_column_per_histogram_step_each_its_steps_share(run, tmp_path, hist, field):
    want = own_shares(run, "0:output", field)
    assert sorted(want) == HIST_STEPS
    fig = plots.plot_hist_heatmap(plots.collect(run), tmp_path / "h.png", hist=hist, kind="output")
    ax = panel(fig, "0:output")
    img = np.asarray(ax.images[0].get_array())
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(s) for s in HIST_STEPS]
    assert img.shape[1] == len(HIST_STEPS)
    np.testing.assert_allclose(img.sum(axis=0), 1.0)
    for col, step in enumerate(HIST_STEPS):
        share = want[step]
        if hist == "log2":  # bottom row: zeros and values below 2**-126; then the powers of two some step holds
            used = np.flatnonzero(sum(want.values())[2:])
            share = np.concatenate([[share[:2].sum()], share[2 + used[0]: 2 + used[-1] + 1]])
        np.testing.assert_allclose(img[:, col], share, err_msg=f"step {step}")


def test_the_color_bar_says_the_color_is_a_share(run, tmp_path):
    fig = plots.plot_hist_heatmap(plots.collect(run), tmp_path / "h.png", kind="output")
    bars = [a for a in fig.axes if "share" in a.get_ylabel()]
    assert len(bars) == 1, [a.get_ylabel() for a in fig.axes]
    image = panel(fig, "0:output").images[0]
    assert image.norm.vmax == 1.0 and image.norm.vmin == plots.SHARE_MIN
    assert "share" in fig.get_suptitle()


def test_the_float_buckets_give_each_histogram_step_its_own_column(tmp_path):
    """Defaults (float buckets), a 60-step run with log_every=20 and hist_every=10: the first window holds the
    ramp's histogram steps 0, 1, 2, 4, 8 and 10, and each is a column of its own values' log2 shares."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    seen = []
    model[0].register_forward_hook(lambda m, i, o: seen.append(o.detach().numpy().ravel().copy()))
    with hookstats.attach(model, history=True, log_every=20, hist_every=10, alerts=False, grads=False) as mon:
        for step in range(60):
            with torch.no_grad():
                model(torch.randn(16, 8) * 4.0 ** (step % 7 - 3))
    steps = [0, 1, 2, 4, 8, 10, 20, 30, 40, 50]
    fig = plots.plot_hist_heatmap(plots.collect(list(mon.history_sink.items())), tmp_path / "h.png", hist="log2",
                                  kind="output")
    ax = panel(fig, "0:output")
    img = np.asarray(ax.images[0].get_array())
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(s) for s in steps]
    want = np.stack([log2_oracle(seen[k]) for k in steps]).astype(np.float64)
    used = np.flatnonzero(want[:, 2:].sum(0))
    want = np.concatenate([want[:, :2].sum(1, keepdims=True), want[:, 2 + used[0]: 2 + used[-1] + 1]], axis=1)
    np.testing.assert_allclose(img, (want / want.sum(1, keepdims=True)).T)
