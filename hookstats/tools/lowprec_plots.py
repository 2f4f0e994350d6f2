"""Charts of the low-precision what-if (hookstats/whatif.py): one per format and recipe, a bar per target of the
share of its values that would underflow and overflow; or all formats and recipes in one figure (a run's report:
one drawing whatever the number of targets)."""
from pathlib import Path

import numpy as np

from .. import whatif
from ..records import last_records
from .plots import image_title, literal_text, new_figure, save_figure

RECIPE_TITLES = {"": "no scaling", "_current": "current scaling", "_delayed": "delayed scaling"}


@literal_text
def plot_lowprec(records, fmt="e4m3", recipe="", path=None):
    """One chart: per target (records: {target: record}, e.g. mon.stats()) the share of its finite values that a
    cast to `fmt` would underflow and overflow under `recipe` ("", "_current" or "_delayed"); a target without
    the figure (NaN: no buckets, or delayed in stats()) has no bar. Returns the matplotlib Figure."""
    if fmt not in whatif.FORMATS:
        raise ValueError(f"fmt must be one of {', '.join(whatif.FORMATS)}, got {fmt!r}")
    if recipe not in RECIPE_TITLES:
        raise ValueError(f"recipe must be one of {', '.join(map(repr, RECIPE_TITLES))}, got {recipe!r}")
    names = list(records)
    fig = new_figure(figsize=(7, 0.3 * len(names) + 1.5))
    ax = fig.subplots()
    y = np.arange(len(names))
    for k, (side, color) in enumerate((("underflow", "tab:blue"), ("overflow", "tab:red"))):
        v = [100 * float(records[t].get(f"{fmt}_{side}{recipe}") or np.nan) for t in names]
        ax.barh(y + 0.4 * k - 0.2, v, height=0.4, color=color, label=side)
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.set_xlabel("% of finite values")
    ax.set_title(f"{fmt}, {RECIPE_TITLES[recipe]}")
    ax.legend(loc="lower right")
    fig.tight_layout()
    return save_figure(fig, path)


def plot_lowprec_all(records, folder):
    """A chart per format and recipe in `folder` (lowprec_<fmt><recipe>.png); returns their paths."""
    paths = []
    for recipe in RECIPE_TITLES:
        for fmt in whatif.FORMATS:
            paths.append(Path(folder) / f"lowprec_{fmt}{recipe or '_none'}.png")
            plot_lowprec(records, fmt, recipe, paths[-1])
    return paths


GRID_FILE = "lowprec.png"
COLUMN_RECIPES = {"": "unscaled", "_current": "current", "_delayed": "delayed"}
MAX_LABELS = 60  # target names beside the rows up to this many targets; more would overlap


def _columns():
    return [(fmt, recipe) for recipe in RECIPE_TITLES for fmt in whatif.FORMATS]


@literal_text
def plot_lowprec_grid(records, path=None):
    """One figure: a row per target (records: {target: record}), a column per format and recipe, the shares of
    its finite values that would underflow (left) and overflow (right), in %, on one color scale up to the
    largest share shown (at least 1%: small losses stay visible; grey: no figure). Returns the matplotlib Figure."""
    names, cols = list(records), _columns()
    shares = {side: np.array([[100 * _number(records[t].get(f"{fmt}_{side}{recipe}")) for fmt, recipe in cols]
                              for t in names]).reshape(len(names), len(cols)) for side in whatif.SIDES}
    top = max([1.0] + [float(np.nanmax(v)) for v in shares.values() if np.isfinite(v).any()])
    fig = new_figure(figsize=(11, min(14.0, 0.22 * len(names) + 2.2)))
    axes = fig.subplots(1, 2, sharey=True)
    from . import axis_marks
    labelled = len(names) <= MAX_LABELS
    col_labels = [f"{fmt} {COLUMN_RECIPES[r]}" for fmt, r in cols]
    for ax, side in zip(axes, whatif.SIDES):
        image = ax.imshow(np.ma.masked_invalid(shares[side]), aspect="auto", cmap="Reds", vmin=0, vmax=top,
                          interpolation="nearest")
        ax.set_facecolor("0.85")
        if labelled:
            ax.set_xticks(range(len(cols)), col_labels, rotation=90, fontsize=7)
        else:  # fixed margins past MAX_LABELS: marks without matplotlib's ticks (axis_marks)
            axis_marks.mark(ax, "bottom", range(len(cols)), col_labels, fontsize=7, rotation=90)
        image_title(ax, f"{side} (% of finite values)", fontsize=9)
    if labelled:
        axes[0].set_yticks(range(len(names)), names, fontsize=7)
        fig.colorbar(image, ax=axes, shrink=0.8, label="%")
    else:
        axis_marks.mark_span(axes[0], "left", -0.5, len(names) - 0.5, integer=True)
        axes[0].set_ylabel(f"{len(names)} targets")
        axis_marks.place_label(axes[0], "left", axis_marks.label_room([str(len(names))], None, "left"))
        axis_marks.mark_scale(fig.colorbar(image, ax=axes, shrink=0.8), "%")
    return save_figure(fig, path, whole_legend=labelled)


def _number(v):
    return np.nan if v is None else float(v)


def save_run_lowprec(items, folder):
    """The what-if figure (plot_lowprec_grid, GRID_FILE) of a run's (step, record) pairs in `folder`: per target
    its last record that has the figures; [] (nothing drawn) where none has them. Returns the paths written."""
    rows, _ = last_records(items, whatif.field_names())
    records = {r["target"]: r for r in rows}
    if not any(_number(r.get(name)) == _number(r.get(name)) for r in rows for name in whatif.field_names()):
        return []
    path = Path(folder) / GRID_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    plot_lowprec_grid(records, path)
    return [path]
