"""The overview charts of a run with more targets than lines or labelled rows (the histogram overview, the dynamic
range past MAX_LABELLED_ROWS): the arrays their images draw against the records the test wrote, worked out here in
float64, and their color bars' labels as plain numbers."""
import numpy as np
import pytest

pytest.importorskip("matplotlib")
from hookstats.tools import plots  # noqa: E402

N, STEPS, SLOTS = plots.MAX_LABELLED_ROWS + 13, 4, 256


def _log2_hists():
    """[N, STEPS, 256] log2 histograms: slot 0 zeros, slot 1 below 2**-126, slot j >= 2 holds [2**(j-128), 2**(j-127))."""
    rng = np.random.default_rng(1)
    h = np.zeros((N, STEPS, SLOTS), dtype=np.int64)
    h[..., 0] = rng.integers(0, 3, size=(N, STEPS))
    centre = rng.integers(118, 140, size=N)  # 2**-10 .. 2**12, a few past fp8 e4m3's 448
    for t in range(N):
        h[t, :, centre[t] - 3: centre[t] + 4] = rng.integers(0, 50, size=(STEPS, 7))
    h[5, :, 128 + 17] = 9  # 2**17 and up: past fp16's max too
    return h


def _series(h):
    items = [(s, {"target": f"m{t}:output", "kind": "output", "mean": 0.0, "std": 1.0, "log2_hist": h[t, s]})
             for s in range(STEPS) for t in range(N)]
    return plots.collect(items)


def named_rows(ax):
    """(row, name) of each name beside an overview image: its texts at the axes' left (right-aligned to it), each at
    its row's height."""
    return [(t.get_position()[1], t.get_text()) for t in ax.texts if t.get_ha() == "right"]


def marked(ax, side):
    """(position, label) of axis_marks.mark()'s labels on the bottom or right of ax."""
    at = {"bottom": ("center", 0), "right": ("left", 1)}[side]
    return [(t.get_position()[at[1]], t.get_text()) for t in ax.texts if t.get_ha() == at[0] and
            t.get_position()[1 - at[1]] == (1.0 if side == "right" else 0.0)]


def _shares(rows):
    rows = rows.astype(np.float64)
    return rows / rows.sum(1, keepdims=True)


def test_histogram_overview_draws_each_targets_first_and_last_record(tmp_path):
    h = _log2_hists()
    fig = plots.plot_hist_overview(_series(h), tmp_path / "o.png", hist="log2")
    nonzero = np.flatnonzero(h[..., 2:].sum((0, 1)))
    window = slice(2 + nonzero[0], 3 + nonzero[-1])
    for ax, step in zip(fig.axes[:2], (0, STEPS - 1)):
        want = np.concatenate([h[:, step, :2].sum(1, keepdims=True), h[:, step, window]], axis=1)
        np.testing.assert_allclose(np.asarray(ax.images[0].get_array()), _shares(want))
        x0, x1, _, _ = ax.images[0].get_extent()
        assert (x0, x1) == (nonzero[0] + 2 - 128 - 1, nonzero[-1] + 2 - 127)  # one column more below: ~0
    every = -(-N // plots.MAX_NAMED_ROWS)
    assert named_rows(fig.axes[0]) == [(r, f"{r}  m{r}:output") for r in range(0, N, every)]
    bar = marked(fig.axes[-1], "right")
    np.testing.assert_allclose([v for v, _ in bar], [1e-4, 1e-3, 1e-2, 0.1, 1])
    assert [text for _, text in bar] == ["0.0001", "0.001", "0.01", "0.1", "1"]


def test_dynamic_range_of_many_targets_draws_each_targets_distribution_and_shares(tmp_path):
    h = _log2_hists().sum(1)  # the run's totals
    totals = {f"m{t}:output": h[t] for t in range(N)}
    fig = plots.plot_dynamic_range(totals, tmp_path / "dr.png")
    left, right = fig.axes[:2]
    lo, hi, _, _ = left.images[0].get_extent()
    strip = h[:, int(lo) + 128: int(hi) + 128].astype(np.float64)  # slot j: log2 |x| in [j-128, j-127)
    np.testing.assert_allclose(np.asarray(left.images[0].get_array()), strip / strip.max(1, keepdims=True))
    finite = h.sum(1).astype(np.float64)
    over = {"fp16": h[:, 128 + 16:].sum(1), "fp8 e4m3": h[:, 128 + 9:].sum(1)}  # |x| >= 2**16, >= 2**9 (448)
    drawn = np.asarray(right.images[0].get_array())
    cols = [f"{f}\n{k}" for f in plots.FORMATS for k in ("under", "over")]
    assert marked(right, "bottom") == list(enumerate(cols))
    for fmt, count in over.items():
        np.testing.assert_allclose(drawn[:, cols.index(f"{fmt}\nover")], 100 * count / finite)
    assert drawn[5, cols.index("fp16\nover")] > 0
    every = -(-N // plots.MAX_NAMED_ROWS)
    assert named_rows(left) == [(r, f"{r}  m{r}:output") for r in range(0, N, every)]


@pytest.mark.parametrize("width", [10, 40, 60])
def test_overview_names_sit_at_their_rows_with_the_axis_label_beyond_them_inside_the_figure(tmp_path, width):
    """The names beside an overview image are plain texts (axis_marks), which matplotlib does not place the axis label
    from: the label is placed beyond the longest name, or 12 points inside the figure's edge where a name of 60
    characters (names.WIDTH) reaches further; each name on its row, a mark at each."""
    h = _log2_hists()
    module = ("encoder.layers.attn.proj." * 3)[: width - 10]  # a module path's letters, dots and digits
    items = [(s, {"target": f"{module}{t:03d}:output", "kind": "output", "mean": 0.0, "std": 1.0,
                  "log2_hist": h[t, s]}) for s in range(STEPS) for t in range(N)]
    series = plots.collect(items)
    for fig in (plots.plot_hist_overview(series, tmp_path / "o.png", hist="log2"),
                plots.plot_layer_stats_overview(series, tmp_path / "l.png")):
        ax = fig.axes[0]
        every = -(-N // plots.MAX_NAMED_ROWS)
        targets = list(series)
        assert named_rows(ax) == [(r, f"{r}  {targets[r]}") for r in range(0, N, every)]
        marks = [line for line in ax.lines if line.get_marker() == 0]  # TICKLEFT
        assert len(marks) == 1 and list(marks[0].get_ydata()) == list(range(0, N, every))
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        renderer = FigureCanvasAgg(fig).get_renderer()
        label = ax.yaxis.label.get_window_extent(renderer)
        names = [t.get_window_extent(renderer) for t in ax.texts]
        assert label.x0 >= 0
        if width <= 40:
            assert label.x1 <= min(b.x0 for b in names)
