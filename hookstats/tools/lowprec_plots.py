"""Charts of the low-precision what-if (hookstats/whatif.py): one per format and recipe, a bar per target of the
share of its values that would underflow and overflow."""
import numpy as np

from .. import whatif
from .plots import literal_text, new_figure, save_figure

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
    from pathlib import Path
    paths = []
    for recipe in RECIPE_TITLES:
        for fmt in whatif.FORMATS:
            paths.append(Path(folder) / f"lowprec_{fmt}{recipe or '_none'}.png")
            plot_lowprec(records, fmt, recipe, paths[-1])
    return paths
