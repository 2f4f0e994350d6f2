"""Tick marks and their labels drawn as plain artists beside an axes, for the overview charts of runs with thousands
of targets: a matplotlib tick is five artists (two marks, a grid line, two labels) that every draw updates and
measures, about 3 ms a labelled tick, while here a side's marks are one line of markers and each label one text. The
axis keeps no ticks of its own, so its label is placed at a fixed distance (matplotlib places it from the tick
labels' extent)."""
import math

from matplotlib import colors, rcParams, ticker, transforms
from matplotlib.font_manager import FontProperties
from matplotlib.markers import TICKDOWN, TICKLEFT, TICKRIGHT

_MARKERS = {"left": TICKLEFT, "right": TICKRIGHT, "bottom": TICKDOWN}
_ALIGN = {"left": ("right", "center"), "right": ("left", "center"), "bottom": ("center", "top")}


def mark(ax, side, positions, labels, fontsize=None, rotation=0):
    """Marks at `positions` (data coordinates along the side's axis) on the `side` ("left", "right", "bottom") of
    ax, each with its label, sized and spaced as matplotlib's major ticks; ax's own ticks on that axis are removed.
    Returns the labels' Text artists."""
    axis = ax.xaxis if side == "bottom" else ax.yaxis
    axis.set_ticks([])
    prefix = "xtick" if side == "bottom" else "ytick"
    size, pad = rcParams[f"{prefix}.major.size"], rcParams[f"{prefix}.major.pad"]
    along = transforms.blended_transform_factory(ax.transData, ax.transAxes) if side == "bottom" else \
        transforms.blended_transform_factory(ax.transAxes, ax.transData)
    at = 1.0 if side == "right" else 0.0
    positions = list(positions)
    xy = (positions, [at] * len(positions)) if side == "bottom" else ([at] * len(positions), positions)
    color = rcParams[f"{prefix}.color"]
    ax.plot(*xy, ls="none", marker=_MARKERS[side], ms=size, mew=rcParams[f"{prefix}.major.width"], color=color,
            transform=along, clip_on=False)
    away = (size + pad) / 72  # inches
    dx, dy = {"left": (-away, 0), "right": (away, 0), "bottom": (0, -away)}[side]
    offset = along + transforms.ScaledTranslation(dx, dy, ax.figure.dpi_scale_trans)
    ha, va = _ALIGN[side]
    labelcolor = rcParams[f"{prefix}.labelcolor"]
    fontsize = rcParams[f"{prefix}.labelsize"] if fontsize is None else fontsize
    return [ax.text(x, y, text, transform=offset, ha=ha, va=va, fontsize=fontsize, rotation=rotation,
                    color=color if labelcolor == "inherit" else labelcolor)
            for x, y, text in zip(*xy, labels)]


def place_label(ax, side, points):
    """Puts the axis label of `side` (set with set_xlabel / set_ylabel) `points` beyond the axes' edge: past the
    marks and labels of mark(), whose extent matplotlib does not know."""
    away = points / 72
    if side == "bottom":
        ax.xaxis.set_label_coords(0.5, 0, transform=ax.transAxes + transforms.ScaledTranslation(
            0, -away, ax.figure.dpi_scale_trans))
    else:
        ax.yaxis.set_label_coords(1.0 if side == "right" else 0.0, 0.5, transform=ax.transAxes +
                                  transforms.ScaledTranslation(away if side == "right" else -away, 0,
                                                               ax.figure.dpi_scale_trans))


def label_room(labels, fontsize, side):
    """Points from the axes' edge to past mark()'s labels on `side`: the marks, their pad, the labels' height
    (bottom: lines of text) or their width (0.6 em a character: a digit is 0.64, a dot 0.32), the axis label's
    pad."""
    prefix = "xtick" if side == "bottom" else "ytick"
    near = rcParams[f"{prefix}.major.size"] + rcParams[f"{prefix}.major.pad"] + rcParams["axes.labelpad"]
    size = points(rcParams[f"{prefix}.labelsize"] if fontsize is None else fontsize)
    if side == "bottom":
        lines = max((str(t).count("\n") + 1 for t in labels), default=0)
        return near + 1.25 * size * lines
    return near + 0.6 * size * max((len(str(t)) for t in labels), default=0)


def points(fontsize):
    """A font size (points, or a name such as "medium") in points."""
    return FontProperties(size=fontsize).get_size_in_points()


def plain(value):
    """A mark's label: the number as %g writes it, with matplotlib's minus sign."""
    return f"{value:g}".replace("-", "\u2212")


def within(values, lo, hi):
    """The values in [lo, hi], up to rounding (a locator's positions may lie a hair outside its span)."""
    slack = 1e-9 * abs(hi - lo)
    return [v for v in values if lo - slack <= v <= hi + slack]


def mark_span(ax, side, lo, hi, fontsize=None, nbins=8, integer=False):
    """mark() at round numbers from lo to hi (matplotlib's default choice of positions: MaxNLocator), labelled
    plain(); returns the labels."""
    found = ticker.MaxNLocator(nbins, steps=[1, 2, 2.5, 5, 10], integer=integer).tick_values(lo, hi)
    at = within(found.tolist(), lo, hi)
    labels = [plain(v) for v in at]
    mark(ax, side, at, labels, fontsize)
    return labels


def mark_bar(bar, values, labels, label=None, fontsize=None, label_size=None):
    """A color bar's scale as mark()s at `values` on its right, instead of its own ticks; its label (of font size
    label_size) beyond them."""
    bar.set_ticks([])
    bar.minorticks_off()
    mark(bar.ax, "right", values, labels, fontsize)
    if label is not None:
        bar.set_label(label, fontsize=label_size)
        place_label(bar.ax, "right", label_room(labels, fontsize, "right"))


def bar_place(fig, labels, label_size, bar_inches=0.17):
    """(left, width) in figure fractions of a color bar at the figure's right edge whose marks (the longest of
    `labels`) and rotated label (of font size label_size) end within the figure, 4 points from its edge."""
    room = label_room(labels, None, "right") + 1.3 * points(label_size) + 4
    width = fig.get_figwidth()
    return 1 - (room / 72 + bar_inches) / width, bar_inches / width


def mark_scale(bar, label=None, fontsize=None, label_size=None):
    """mark_bar() at round values of the bar's norm: its decades on a log scale (round numbers where fewer than two
    decades fall within it), else MaxNLocator's numbers; none where the norm has no finite span."""
    lo, hi = bar.norm.vmin, bar.norm.vmax
    values = []
    if lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi) and lo < hi:
        if isinstance(bar.norm, colors.LogNorm):
            decades = range(math.ceil(math.log10(lo) - 1e-9), math.floor(math.log10(hi) + 1e-9) + 1)
            values = [10.0 ** k for k in decades]
        if len(values) < 2:
            found = ticker.MaxNLocator(6, steps=[1, 2, 2.5, 5, 10]).tick_values(lo, hi).tolist()
            values = within(found, lo, hi)
    mark_bar(bar, values, [f"{v:.3g}".replace("-", "\u2212") for v in values], label, fontsize, label_size)
