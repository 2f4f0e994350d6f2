"""axis_marks: the overview charts' tick marks and labels drawn as plain artists. Each label at its value, the values
the round numbers a reader expects (a log bar's decades), the axis' own ticks gone, the axis label beyond them."""
import math

import numpy as np
import pytest

pytest.importorskip("matplotlib")
from matplotlib import colors  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402

from hookstats.tools import axis_marks, plots  # noqa: E402


def _bar(norm):
    fig = plots.new_figure(figsize=(4, 4))
    ax = fig.subplots()
    image = ax.imshow(np.ones((2, 2)) * norm.vmin, norm=norm)
    return fig, fig.colorbar(image, ax=ax)


def _right(ax):
    return [(t.get_position()[1], t.get_text()) for t in ax.texts if t.get_ha() == "left"]


@pytest.mark.parametrize("lo, hi, want", [
    (1e-4, 1.0, [1e-4, 1e-3, 1e-2, 0.1, 1.0]),  # the decades
    (3e-3, 0.5, [1e-2, 0.1]),
    (0.2, 0.9, [0.2, 0.4, 0.6, 0.8]),  # no two decades: round numbers within
])
def test_a_log_bar_is_marked_at_its_decades_or_round_numbers(lo, hi, want):
    fig, bar = _bar(colors.LogNorm(lo, hi))
    axis_marks.mark_scale(bar, "share")
    got = _right(bar.ax)
    np.testing.assert_allclose([v for v, _ in got], want, rtol=1e-12)
    assert [t for _, t in got] == [f"{v:.3g}" for v in want]
    assert len(bar.ax.get_yticks()) == 0 and len(bar.ax.yaxis.get_minorticklocs()) == 0


def test_a_linear_bar_is_marked_at_round_numbers_within_its_span_with_a_minus_sign():
    fig, bar = _bar(colors.Normalize(-0.021, 0.034))
    axis_marks.mark_scale(bar)
    got = _right(bar.ax)
    values = [v for v, _ in got]
    assert values == sorted(values) and -0.021 <= values[0] and values[-1] <= 0.034 and len(values) >= 4
    steps = np.diff(values)
    np.testing.assert_allclose(steps, steps[0])
    mantissa = steps[0] / 10 ** math.floor(math.log10(steps[0]) + 1e-9)
    assert any(mantissa == pytest.approx(m) for m in (1, 2, 2.5, 5))  # a round step
    for v, text in got:
        assert float(text.replace("\u2212", "-")) == pytest.approx(v, abs=1e-12)
    assert any(t.startswith("\u2212") for _, t in got)


def test_bottom_marks_replace_the_axis_ticks_and_the_label_goes_below_them():
    fig = plots.new_figure(figsize=(6, 3))
    ax = fig.subplots()
    ax.set_xlim(-0.5, 9.5)
    labels = axis_marks.mark_span(ax, "bottom", -0.5, 9.5, integer=True)
    ax.set_xlabel("bin")
    axis_marks.place_label(ax, "bottom", axis_marks.label_room(labels, None, "bottom"))
    assert len(ax.get_xticks()) == 0
    got = [(t.get_position()[0], t.get_text()) for t in ax.texts]
    assert got == [(v, str(v)) for v in range(0, 10, 2)]
    renderer = FigureCanvasAgg(fig).get_renderer()
    lowest = min(t.get_window_extent(renderer).y0 for t in ax.texts)
    assert ax.xaxis.label.get_window_extent(renderer).y1 <= lowest
