"""Charts of the flight recorder and of the gradient norms: plot_flight (targets x steps before an alert, the first
target and its neighbours in step order, the alert step marked) and plot_grad_norms (the global gradient norm per
step over each parameter's share, the clipping max drawn)."""
import functools

import numpy as np

from ..extras import require
from .chart_files import png_options

NEIGHBOURS = 4  # targets on each side of the first one, in step order


def literal_text(plot):
    """Draws with mathtext and TeX off: target names come from users and files."""
    @functools.wraps(plot)
    def draw(*args, **kwargs):
        with require("matplotlib", "hookstats charts").rc_context({"text.usetex": False, "text.parse_math": False}):
            return plot(*args, **kwargs)
    return draw


def figure(**kw):
    return require("matplotlib.figure", "hookstats charts").Figure(**kw)


def save(fig, path):
    if path is not None:  # "tight": long target names stay whole
        fig.savefig(path, dpi=110, bbox_inches="tight", **png_options(path))
    return fig


@literal_text
def plot_flight(flight, path=None, stat="std", neighbours=NEIGHBOURS):
    """A heatmap of log10 `stat` (default std) per target and step, NaN/Inf cells hatched, the alert step framed;
    rows: the flight's first target and up to `neighbours` targets on each side of it in step order."""
    targets = flight.targets
    at = targets.index(flight.target) if flight.target in targets else 0
    rows = list(range(max(0, at - neighbours), min(len(targets), at + neighbours + 1)))
    with np.errstate(divide="ignore", invalid="ignore"):
        values = np.log10(np.abs(flight.columns[stat][:, rows].T))
    bad = np.zeros_like(values, dtype=bool)
    for k in ("nan", "posinf", "neginf"):
        if k in flight.columns:
            bad |= np.nan_to_num(flight.columns[k][:, rows].T) > 0
    fig = figure(figsize=(1.2 + 0.5 * max(4, len(flight.steps)), 1.2 + 0.4 * len(rows)))
    ax = fig.add_subplot()
    masked = np.ma.masked_invalid(np.where(bad, np.nan, values))
    im = ax.imshow(masked, aspect="auto", cmap="viridis", interpolation="nearest")
    for r, c in zip(*np.nonzero(bad)):
        ax.add_patch(_rect(c, r, fill=True, color="tab:red", alpha=0.8))
    if flight.step in flight.steps:
        c = flight.steps.index(flight.step)
        ax.add_patch(_rect(c, rows.index(at) if at in rows else 0, fill=False, color="black", lw=2.5))
        ax.axvline(c - 0.5, color="black", lw=1, ls="--")
    ax.set_xticks(range(len(flight.steps)), [str(s) for s in flight.steps])
    ax.set_yticks(range(len(rows)), [("> " if r == at else "") + targets[r] for r in rows])
    ax.set_xlabel("step (red: NaN/Inf seen; framed: the alert's target and step)")
    ax.set_title(f"before the alert: {flight.message}", fontsize=9)
    fig.colorbar(im, ax=ax, label=f"log10 {stat}")
    return save(fig, path)


def _rect(col, row, **kw):
    from matplotlib.patches import Rectangle
    return Rectangle((col - 0.5, row - 0.5), 1, 1, **kw)


@literal_text
def plot_grad_norms(norms, path=None, max_targets=8):
    """The global gradient norm per step (a line, log scale) and each parameter's share of its square (stacked
    areas: the `max_targets` largest on average, the others summed), with the clip_norm line and the clipped
    steps marked when norms.clip_norm is set."""
    fig = figure(figsize=(9, 6))
    top, bottom = fig.subplots(2, 1, sharex=True)
    steps = np.asarray(norms.steps)
    total = norms.total
    top.plot(steps, total, color="black", label="global norm")
    if norms.clip_norm is not None:
        top.axhline(norms.clip_norm, color="tab:red", ls="--", label=f"clip_norm {norms.clip_norm:g}")
        clipped = norms.clipped
        top.scatter(steps[clipped], total[clipped], color="tab:red", zorder=3, s=12, label="clipped steps")
    if np.all(np.isfinite(total) & (total > 0)):
        top.set_yscale("log")
    top.set_ylabel("gradient L2 norm")
    top.legend(fontsize=8)
    share = np.nan_to_num(norms.share)
    order = np.argsort(-share.mean(axis=0)) if share.size else np.array([], dtype=int)
    shown = order[:max_targets].tolist()
    layers = [share[:, p] for p in shown]
    labels = [norms.targets[p].split(":")[0] for p in shown]
    if len(order) > max_targets:
        layers.append(share[:, order[max_targets:]].sum(axis=1))
        labels.append(f"{len(order) - max_targets} others")
    if layers:
        bottom.stackplot(steps, *layers, labels=labels)
    bottom.set_ylim(0, 1)
    bottom.set_ylabel("share of norm^2")
    bottom.set_xlabel("step")
    bottom.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return save(fig, path)
