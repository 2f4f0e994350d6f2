"""A run with more targets than lines can tell apart: layer stats drawn as one image per statistic (a row per
target in forward order, a column per step), the histogram heatmaps as their first panels with the title saying of
how many. Checked against the records the test wrote."""
import numpy as np
import pytest

pytest.importorskip("matplotlib")
from hookstats.tools import plots  # noqa: E402

N, STEPS = plots.MAX_LINES + 7, 5


def _records():
    rng = np.random.default_rng(0)
    mean = rng.normal(size=(N, STEPS))
    std = rng.uniform(0.1, 2.0, size=(N, STEPS))
    items = [(s, {"target": f"m{t}:output", "kind": "output", "mean": mean[t, s], "std": std[t, s],
                  "log2_hist": rng.integers(0, 5, size=256)})
             for s in range(STEPS) for t in range(N) if not (t == 3 and s == 2)]  # one record missing
    mean[3, 2] = std[3, 2] = np.nan
    return items, mean, std


def test_layer_stats_of_many_targets_is_one_image_per_statistic_holding_every_value(tmp_path):
    items, mean, std = _records()
    series = plots.collect(items)
    paths = plots.save_all(series, tmp_path)
    assert tmp_path / "layer_stats_output.png" in paths
    fig = plots.plot_layer_stats_overview(series, kind="output")
    images = {ax.get_title(): ax.images[0].get_array() for ax in fig.axes if ax.images}
    for label, want in (("mean", mean), ("std", std)):
        got = next(v for k, v in images.items() if k.startswith(label))
        np.testing.assert_array_equal(np.ma.getmaskarray(got), np.isnan(want))
        np.testing.assert_allclose(got.filled(np.nan), want)
    assert f"{N} targets" in fig._suptitle.get_text()


def test_histogram_heatmaps_of_many_targets_draw_the_first_panels_and_say_so():
    items, _, _ = _records()
    fig = plots.plot_hist_heatmap(plots.collect(items), hist="log2", max_targets=plots.MAX_PANELS)
    shown = [ax.get_title() for ax in fig.axes if ax.get_visible() and ax.images]
    assert shown == [f"m{t}:output" for t in range(plots.MAX_PANELS)]
    assert f"first {plots.MAX_PANELS} of {N} targets" in fig._suptitle.get_text()
