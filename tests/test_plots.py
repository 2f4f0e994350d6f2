"""Charts: each renders to a PNG and plots the numbers it was given (read back from the figure's artists);
the fp16/bf16/fp8 under/overflow shares against NumPy counts over the raw values."""
import numpy as np
import pytest
import torch
from helpers import oracle
from torch import nn

import hookstats
from hookstats.tools import plots
from hookstats.config import StatsConfig

pytestmark = pytest.mark.usefixtures("every_step_histograms")  # their oracles count every step's histograms

pytest.importorskip("matplotlib")
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def series():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # the kernel's per-step histograms (linear, log2 slots); charts with float buckets: tests/test_float_plots.py
    mon = hookstats.attach(model, history=True, log_every=5, linear_hist=True, float_hist=False)
    for _ in range(12):
        model(torch.randn(16, 8)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    mon.remove()
    return plots.collect(mon.history_sink.items()), mon


def test_collect_keeps_every_step_in_forward_order(series):
    s, mon = series
    assert list(s)[:2] == ["0:output", "0:grad_output"]
    df = mon.history()
    want = df[(df.target == "2:output") & (df.stat == "std")].sort_values("step")
    np.testing.assert_array_equal(s["2:output"]["steps"], want.step.to_numpy())
    np.testing.assert_allclose(s["2:output"]["std"], want.value.to_numpy())
    assert s["2:output"]["hist"].shape == (12, mon.cfg.nbins) and s["2:output"]["log2_hist"].shape == (12, 256)


def test_layer_stats_chart_plots_the_series(series, tmp_path):
    s, _ = series
    fig = plots.plot_layer_stats(s, tmp_path / "ls.png")
    assert (tmp_path / "ls.png").read_bytes()[:8] == PNG
    mean_ax, std_ax, nz_ax = fig.axes[:3]
    assert [line.get_label() for line in mean_ax.lines] == ["0:output", "2:output"]
    np.testing.assert_allclose(std_ax.lines[1].get_ydata(), s["2:output"]["std"])
    np.testing.assert_allclose(nz_ax.lines[0].get_ydata(), 100 * s["0:output"]["near_zero"])


@pytest.mark.parametrize("hist", ["linear", "log2"])
def test_heatmap_image_is_each_steps_share_per_bin(series, tmp_path, hist):
    s, _ = series
    fig = plots.plot_hist_heatmap(s, tmp_path / "h.png", hist=hist, kind="grad_output")
    assert (tmp_path / "h.png").read_bytes()[:8] == PNG
    img = np.asarray(fig.axes[0].images[0].get_array())
    counts = s["0:grad_output"]["hist" if hist == "linear" else "log2_hist"]
    assert img.shape[1] == 12
    share = counts / counts.sum(axis=1, keepdims=True)
    if hist == "linear":
        np.testing.assert_allclose(img, share.T)
    else:  # bottom row: zeros and values below 2**-126, then the occupied powers of two
        np.testing.assert_allclose(img[0], share[:, :2].sum(1))
        np.testing.assert_allclose(img[1:].sum(0), share[:, 2:].sum(1))
    np.testing.assert_allclose(img.sum(0), 1.0)


def test_range_shares_against_numpy_counts_over_the_values():
    rng = np.random.default_rng(0)
    x = np.concatenate([np.sign(rng.normal(size=4000)) * np.exp2(rng.uniform(-40, 30, 4000)),
                        np.zeros(50), [1e-40, -3e-39]])  # float32 subnormals land in slot 1
    cfg = StatsConfig(float_hist=False)  # the kernel's log2 slots
    t = torch.tensor(x, dtype=torch.float32)
    log2 = oracle(t, cfg)[1][2 + 3: 2 + 3 + 256]  # count, near-zero, NaN/Inf, then the log2 slots
    v = np.abs(t.double().numpy())
    known = {"fp16": (2.0 ** -24, 2.0 ** -14, 65504.0), "bf16": (2.0 ** -133, 2.0 ** -126, 3.3895313892515355e38),
             "fp8 e4m3": (2.0 ** -9, 2.0 ** -6, 448.0), "fp8 e5m2": (2.0 ** -16, 2.0 ** -14, 57344.0)}
    got = plots.range_shares(log2)
    for name, (sub, normal, mx) in known.items():
        assert plots.format_ranges()[name] == pytest.approx((sub, normal, mx))
        under = ((v > 0) & (v < sub)).mean()
        over_bound = (v >= 2.0 ** (np.floor(np.log2(mx)) + 1)).mean()
        if name != "bf16":  # bf16 reaches below 2**-126, where the log2 bins stop telling values apart
            assert got[name]["underflow"] == pytest.approx(under)
            assert got[name]["subnormal"] == pytest.approx(((v >= sub) & (v < normal)).mean())
        assert got[name]["overflow"] == pytest.approx(over_bound)
        assert got[name]["overflow"] <= (v > mx).mean()


def test_dynamic_range_chart_shows_the_shares(series, tmp_path):
    s, mon = series
    totals = {t: r["log2_hist"] for t, r in mon.stats().items()}
    fig = plots.plot_dynamic_range(totals, tmp_path / "dr.png")
    assert (tmp_path / "dr.png").read_bytes()[:8] == PNG
    table = np.asarray(fig.axes[1].images[0].get_array())
    first = plots.range_shares(totals[next(iter(totals))])
    np.testing.assert_allclose(table[0, :2], [100 * first["fp16"]["underflow"], 100 * first["fp16"]["overflow"]])
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == list(totals)


def test_save_all_and_bad_arguments(series, tmp_path, monkeypatch):
    s, _ = series
    drawn = {}
    real = plots.plot_dynamic_range
    monkeypatch.setattr(plots, "plot_dynamic_range", lambda log2, path: drawn.setdefault(path.name, list(log2))
                        and real(log2, path))
    paths = plots.save_all(s, tmp_path / "charts")
    assert {p.name for p in paths} == {"layer_stats_output.png", "layer_stats_grad_output.png",
                                       "hist_linear_output.png", "hist_log2_output.png",
                                       "hist_linear_grad_output.png", "hist_log2_grad_output.png", "dynamic_range.png",
                                       "dynamic_range_grad_output.png"}
    # one dynamic-range chart per kind, the forward outputs in dynamic_range.png (not crowded out by others)
    assert drawn["dynamic_range.png"] == [t for t in s if s[t]["kind"] == "output"]
    assert drawn["dynamic_range_grad_output.png"] == [t for t in s if s[t]["kind"] == "grad_output"]
    assert all(p.read_bytes()[:8] == PNG for p in paths)
    with pytest.raises(ValueError, match="hist must be 'linear' or 'log2'"):
        plots.plot_hist_heatmap(s, hist="cubic")
    with pytest.raises(KeyError, match="no history for \\['nope'\\]"):
        plots.plot_layer_stats(s, targets=["nope"])


@pytest.fixture(scope="module")
def many():
    """30 Linear layers: more targets of one kind than any chart showed before (heatmap 9, lines 16, range 24)."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(30)])
    mon = hookstats.attach(model, history=True, log_every=3, linear_hist=True, float_hist=False)
    for _ in range(3):
        model(torch.randn(8, 4)).square().mean().backward()
    mon.remove()
    s = plots.collect(mon.history_sink.items())
    return s, [f"{k}:output" for k in range(30)], {t: r["log2_hist"] for t, r in mon.stats().items()
                                                     if r["kind"] == "output"}


def panel_titles(fig):
    """The titles of a heatmap's target panels (the color bar's axes hold no image)."""
    return [ax.get_title() for ax in fig.axes if ax.get_visible() and ax.images]


def test_every_chart_shows_every_target_unless_told_and_then_says_so(many):
    s, outputs, totals = many
    fig = plots.plot_hist_heatmap(s, hist="log2")
    assert panel_titles(fig) == outputs
    assert "30 targets" in fig.get_suptitle()
    fig = plots.plot_layer_stats(s)
    assert [line.get_label() for line in fig.axes[0].lines] == outputs
    fig = plots.plot_dynamic_range(totals)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == outputs
    # an explicit cap draws the first ones and says on the chart how many of how many
    fig = plots.plot_hist_heatmap(s, max_targets=9)
    assert panel_titles(fig) == outputs[:9]
    assert "first 9 of 30 targets" in fig.get_suptitle()
    fig = plots.plot_layer_stats(s, max_targets=5)
    assert len(fig.axes[0].lines) == 5 and "first 5 of 30 targets" in fig.get_suptitle()
    fig = plots.plot_dynamic_range(totals, max_targets=7)
    assert len(fig.axes[0].get_yticklabels()) == 7 and "first 7 of 30 targets" in fig.axes[0].get_title()


def test_a_heatmap_names_the_targets_it_has_no_histogram_for(many):
    s, outputs, _ = many
    s = {t: dict(v) for t, v in s.items()}
    s[outputs[3]]["hist"] = None
    fig = plots.plot_hist_heatmap(s, hist="linear")
    assert outputs[3] not in panel_titles(fig)
    assert f"no histogram: {outputs[3]}" in fig.get_suptitle()
