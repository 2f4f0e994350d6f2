"""Every word of every chart a report draws lies within its image: titles, axis labels, marks, names and the colour
bars' labels (a colour bar's label once fell past the figure's right edge, cut from the PNG). Figures saved with
a tight box (a legend of long names) grow to hold what they draw and are left out."""
import pytest
import torch
from torch import nn

import hookstats
from hookstats.tools import plots

pytest.importorskip("matplotlib")


def series_of(n_layers):
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(n_layers) for m in (nn.Linear(8, 8), nn.ReLU())])
    with hookstats.attach(model, grads=False, history=True, log_every=10, hist_every=5, linear_hist=True,
                          log_hist=True, alerts=False) as mon:
        for step in range(20):
            (model(torch.randn(16, 8) * (1 + step)) ** 2).mean().backward()
    return plots.collect(list(mon.history_sink.items()))


def outside(fig):
    """The visible, non-empty texts of fig whose drawn box leaves the figure (1 pixel of slack)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text
    renderer = FigureCanvasAgg(fig).get_renderer()
    box = fig.bbox
    out = []
    for t in fig.findobj(Text):
        if not t.get_visible() or not t.get_text().strip():
            continue
        e = t.get_window_extent(renderer)
        if e.x0 < box.x0 - 1 or e.y0 < box.y0 - 1 or e.x1 > box.x1 + 1 or e.y1 > box.y1 + 1:
            out.append((t.get_text()[:50], tuple(round(v) for v in e.extents), tuple(round(v) for v in box.extents)))
    return out


@pytest.mark.parametrize("n_layers", [3, plots.MAX_LINES + 1], ids=["panels", "overview"])
def test_every_text_of_every_chart_lies_within_its_figure(n_layers, tmp_path, monkeypatch):
    drawn = []
    save = plots.save_figure

    def keep(fig, path, whole_legend=False):
        drawn.append((path.name, fig, whole_legend))
        return save(fig, path, whole_legend)
    monkeypatch.setattr(plots, "save_figure", keep)
    series = series_of(n_layers)
    assert (len(series) > plots.MAX_LINES) == (n_layers > plots.MAX_LINES)  # the overview charts past MAX_LINES
    plots.save_all(series, tmp_path)
    names = [name for name, _, _ in drawn]
    assert any(name.startswith("hist_linear") for name in names) and any(n.startswith("hist_log2") for n in names)
    assert any(name.startswith("dynamic_range") for name in names)
    for name, fig, tight in drawn:
        if not tight:
            assert outside(fig) == [], name
