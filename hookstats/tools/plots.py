"""Charts of the history with matplotlib (no pyplot state touched): layer stats over steps (fastai's
plot_layer_stats), histogram heatmaps over steps (fastai's color_dim) for the linear bins (configured ones, or
a view of the float buckets over one span for all steps shown) and the log2 bins, and a dynamic-range chart
with the fp16/bf16/fp8 ranges and the share of values each would under/overflow (from the float buckets when
the run has them, else from the log2 bins of a run saved without them). Every text is drawn literally: a
target named `$...$` is its characters, never mathtext or TeX."""
import functools
import math
import re

import numpy as np

from .. import buckets, layout, statistics
from ..extras import require
from ..names import short
from ..phases import phase_label, record_phase
from ..targets import KINDS, Kind
from .chart_files import png_options

HEATMAP_BINS = 64
HEATMAP_SPAN_Q = (0.001, 0.999)
MAX_STEP_TICKS = 12  # step labels under a heatmap's columns  # each step's p0.1 .. p99.9: the span is the widest of the steps shown

# Past these many targets a chart draws an overview, not one line, panel or labelled row per target: each of those
# costs ~10 ms to draw, and a large model has thousands of targets
MAX_LINES = 40  # layer stats: one image per statistic beyond (a row per target)
MAX_PANELS = 24  # histogram heatmaps: the first ones, the title says of how many
MAX_LABELLED_ROWS = 60  # dynamic range: rows without their share written in them, every k-th name beside them
# an overview's row names: every k-th target's, at most this many. Text is most of a chart's drawing (each glyph
# ~0.3 ms in matplotlib's Agg): 24 names along 2,000 rows say where each part of the model is
MAX_NAMED_ROWS = 24

FORMATS = buckets.FORMATS  # name: (smallest subnormal, smallest normal, max), as torch.finfo has them
FORMAT_COLORS = {"fp16": "tab:red", "bf16": "tab:blue", "fp8 e4m3": "tab:green", "fp8 e5m2": "tab:orange"}


def new_figure(**kw):
    return _matplotlib("figure").Figure(**kw)


def _matplotlib(module=None):
    """matplotlib or one of its modules; a missing matplotlib is one line with its install command
    (extras.MissingExtra)."""
    return require("matplotlib" + ("" if module is None else f".{module}"), "hookstats charts")


def literal_text(plot):
    """Draws `plot`'s figure with mathtext and TeX off, from its first artist to the saved file: names come from
    users and files, and mathtext of a crafted name aborts the drawing."""
    @functools.wraps(plot)
    def draw(*args, **kwargs):
        with _matplotlib().rc_context({"text.usetex": False, "text.parse_math": False}):
            return plot(*args, **kwargs)
    return draw


# ---- data ----
def collect(source):
    """-> {target: series}, where a series holds NumPy arrays over steps: steps, the plotted statistics
    (statistics.PLOTTED: mean, std, near_zero, near_zero_rel; NaN where a record lacks one), and per
    histogram hist / log2_hist / float_view ([k, bins] of the k records that have it, None when none does)
    with `<name>_steps` (those records' steps); float_view is the linear view of the float buckets over one
    span for all of the target's steps (float_view_edges), float_total the buckets summed over the steps.
    Plus kind and hist_edges. Targets keep their first-seen order. source: a MemorySink (or anything with
    items() giving (step, record) pairs), a saved history.jsonl / history.csv or the run folder holding one,
    or (step, record) pairs (read_jsonl(path)[0], read_csv(path)[0])."""
    return series_of(_columns(source))


def series_of(columns):
    """collect() of a history read as columns (hookstats.sinks.read_history_columns)."""
    out = {}
    for target, rows in zip(columns.labels, columns.rows_by_label()):
        if not len(rows):
            continue
        rows = rows[np.argsort(columns.steps[rows], kind="stable")]
        first = columns.built.get(int(rows[0])) if columns.has_hist[rows[0]] else None
        s = {"target": target, "kind": columns.kinds[columns.kind[rows[0]]], "steps": columns.steps[rows]}
        for stat in (st.name for st in statistics.PLOTTED):
            s[stat] = columns.numeric[stat][rows]
        with_hist = [(int(columns.steps[i]), columns.histograms(i)) for i in rows[columns.has_hist[rows]].tolist()]
        for h in ("hist", "log2_hist", "float_hist"):
            have = [(step, r[h]) for step, r in with_hist if r.get(h) is not None]
            s[h + "_steps"] = np.array([step for step, _ in have], dtype=np.int64)
            s[h] = np.stack([np.asarray(v, dtype=np.int64) for _, v in have]) if have else None
        s["hist_edges"] = None if first is None else first.get("hist_edges")
        s["float_view_steps"] = s.pop("float_hist_steps")
        s["float_view"] = s["float_view_edges"] = s["float_total"] = None
        out[target] = s
    _float_views(list(out.values()))
    return out


VIEW_BATCH = 256  # series whose float views are worked out in one call (their buckets copied once more meanwhile)


def _float_views(series):
    """Replaces each series' float buckets ([k, 4096] each, large) by their linear view over one span (the lowest
    p0.1 to the highest p99.9 of its steps) and their sum over the steps; series of the same k in one call."""
    by_k = {}
    for s in series:
        fh = s.pop("float_hist")
        if fh is not None:
            by_k.setdefault(fh.shape[0], []).append((s, fh))
    for group in by_k.values():
        for at in range(0, len(group), VIEW_BATCH):
            batch = group[at: at + VIEW_BATCH]
            fh = np.stack([f for _, f in batch])  # [targets, k, FLOAT_SLOTS]
            with np.errstate(all="ignore"):
                q = buckets.quantiles(fh, HEATMAP_SPAN_Q)
            lo, hi = np.nanmin(q[..., 0], axis=1, initial=np.inf), np.nanmax(q[..., 1], axis=1, initial=-np.inf)
            # one value (or none) throughout: +-1/8 around it, +-1 around zero
            flat, finite = ~(lo < hi), np.isfinite(lo)
            w = np.where(finite & (lo != 0), np.abs(np.where(finite, lo, 0)) / 8, 1.0)
            lo, hi = (np.where(flat, np.where(finite, lo - w, -1.0), lo), np.where(flat, np.where(finite, lo + w, 1.0), hi))
            k = fh.shape[1]
            view = buckets.linear_view(fh, HEATMAP_BINS, span=(np.repeat(lo[:, None], k, 1), np.repeat(hi[:, None], k, 1)))
            total = fh.sum(axis=1)
            for r, (s, _) in enumerate(batch):
                s["float_total"] = total[r]
                s["float_view"], s["float_view_edges"] = view["counts"][r], view["edges"][r, 0]


def _columns(source):
    import os
    from collections.abc import Mapping

    from ..sinks import Columns, read_history_columns
    if isinstance(source, Columns):
        return source
    if isinstance(source, (str, os.PathLike)):
        return read_history_columns(source)[0]
    if callable(getattr(source, "items", None)) and not isinstance(source, Mapping):
        source = source.items()
    if isinstance(source, Mapping) or not hasattr(source, "__iter__"):
        raise TypeError("collect takes a MemorySink, a history file or run folder, or (step, record) pairs; "
                        f"got {type(source).__name__}")
    pairs = list(source)
    for p in pairs:
        if not (isinstance(p, tuple) and len(p) == 2 and isinstance(p[1], Mapping) and "target" in p[1]):
            raise TypeError("collect takes a MemorySink, a history file or run folder, or (step, record) "
                            f"pairs; got an item {type(p).__name__} {str(p)[:60]}")
    return Columns.from_items(pairs)


def totals(series):
    """{target: float buckets summed over the recorded steps}, or for a target without them (a run saved
    without float buckets) its log2 histogram summed over the steps."""
    out = {}
    for t, s in series.items():
        if s.get("float_total") is not None:
            out[t] = s["float_total"]
        elif s["log2_hist"] is not None:
            out[t] = s["log2_hist"].sum(0)
    return out


def _pick(series, targets, kind, max_targets):
    """(targets to draw, how many there were): every target of the kind unless max_targets says fewer."""
    if targets is None:
        targets = [t for t, s in series.items() if kind is None or s["kind"] == kind]
    missing = [t for t in targets if t not in series]
    if missing:
        more = f" and {len(series) - 10} more" if len(series) > 10 else ""
        raise KeyError(f"no history for {missing}; targets are {list(series)[:10]}{more}")
    return _cap(targets, max_targets)


def _cap(targets, max_targets):
    targets = list(targets)
    return (targets if max_targets is None else targets[:max_targets]), len(targets)


def _count(shown, total):
    """What a chart's title says about the targets it draws: never fewer without saying so."""
    return f"{total} targets" if shown == total else f"first {shown} of {total} targets"


def save_figure(fig, path, whole_legend=False):
    if path is not None:  # bbox "tight" keeps a legend's long target names whole, at the cost of a second draw
        fig.savefig(path, dpi=110, bbox_inches="tight" if whole_legend else None, **png_options(path))
    return fig


PLOT_MAX = 1e300


def name_rows(ax, targets, every, fontsize=6, axis_label="target (forward order)"):
    """Every `every`-th row of an overview image named at ax's left ("<row>  <target>") as plain marks and texts
    (axis_marks: matplotlib's ticks cost ~3 ms each to draw), and the axis label beyond the names, kept within the
    figure (12 points from its edge) where the names reach further."""
    from . import axis_marks
    rows = np.arange(0, len(targets), every)
    names = [f"{r}  {short(targets[r])}" for r in rows]
    axis_marks.mark(ax, "left", rows, names, fontsize=fontsize)
    if axis_label is not None:
        ax.set_ylabel(axis_label)
        margin = ax.get_position().x0 * ax.figure.get_figwidth() * 72  # points left of the axes
        axis_marks.place_label(ax, "left", min(axis_marks.label_room(names, fontsize, "left"), margin - 12))


def image_title(ax, text, **kw):
    """ax.set_title at the axes' top, where matplotlib would place it over an image whose axes have no ticks above
    and no offset text (names or bins on the y axis): saying so skips its search for a higher place, which lays
    out every y tick label again (up to a quarter of an overview chart's time in a profile)."""
    return ax.set_title(text, y=1.0, **kw)

# ---- layer stats ----
@literal_text
def plot_layer_stats(series, path=None, targets=None, kind=Kind.OUTPUT.value, max_targets=None):
    """Mean, std and near-zero % of each target over steps, one line per target in forward order (every
    target of the kind; max_targets: the first ones, and the title says how many of how many). Each target has
    its own color and line style (a qualitative palette, styles cycling past its 10 colors) and its number in
    the legend at the end of its line in every panel; a bounded panel (near zero, 0..100 %) is scaled to the
    data, so 0.15 % is not flattened into a line."""
    targets, total = _pick(series, targets, kind, max_targets)
    height = max(4.6, 1.4 + 0.13 * len(targets))  # the legend holds one line per target
    fig = new_figure(figsize=(15, height))
    fig.subplots_adjust(left=0.05, right=0.8, top=1 - 0.64 / height, bottom=0.55 / height, wspace=0.3)
    plotted = _panels(series, targets)
    axes = fig.subplots(1, len(plotted))
    logs = [st.plot.log and any(np.nanmin(series[t][st.name], initial=np.inf) > 0 for t in targets) for st in plotted]
    handles = []
    for k, t in enumerate(targets):
        s = series[t]
        style = line_style(k)
        for n, (ax, st) in enumerate(zip(axes, plotted)):
            # matplotlib's axis arithmetic overflows near float64's max (a span of inf): finite values beyond
            # +-PLOT_MAX are drawn there, at the axis' end (inf and NaN stay gaps)
            y = s[st.name]
            y = np.where(np.isfinite(y), np.clip(y, -PLOT_MAX, PLOT_MAX), y)
            have = np.isfinite(y) if st.plot.instead_of else slice(None)  # measured at the flush steps only
            x, y = s["steps"][have], st.plot.scale * y[have]
            line, = ax.plot(x, y, lw=1.2, **style, **({"label": short(t)} if n == 0 else {}))
            if n == 0:
                handles.append(line)
            # a log panel has no place for a value <= 0 (a target whose std is 0): its label would land at -inf,
            # and the tight bounding box with it
            end = np.flatnonzero(np.isfinite(y) & ((y > 0) if logs[n] else True))
            if end.size:  # a direct label: the target's number in the legend, at its line's last point
                ax.annotate(str(k), (x[end[-1]], y[end[-1]]), xytext=(3, 0), textcoords="offset points",
                            fontsize=6, color=style["color"], va="center", annotation_clip=False)
    for ax, st, log in zip(axes, plotted, logs):
        ax.set_title(st.plot.label)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if log:
            ax.set_yscale("log")
        if st.plot.ylim is not None:
            ax.set_ylim(*data_limits([st.plot.scale * series[t][st.name] for t in targets], st.plot.ylim))
    fig.suptitle(f"layer stats over steps ({kind or 'all kinds'}, {_count(len(targets), total)})")
    if targets:
        fig.legend(handles, [f"{k}  {short(t)}" for k, t in enumerate(targets)], loc="upper left",
                   bbox_to_anchor=(0.81, 1 - 0.55 / height), fontsize=7, title="target (forward order)",
                   title_fontsize=8)
    return save_figure(fig, path, whole_legend=True)


@literal_text
def plot_layer_stats_overview(series, path=None, kind=Kind.OUTPUT.value):
    """plot_layer_stats' panels as images, for runs with more targets than lines can tell apart: row = target
    (forward order), column = step, color = value (a log scale where the panel is logarithmic and the values
    positive). One image per panel costs the same for 20 targets as for 20,000."""
    from . import axis_marks
    targets = [t for t, s in series.items() if kind is None or s["kind"] == kind]
    plotted = _panels(series, targets)
    fig = new_figure(figsize=(15, 7))  # fixed margins: a layout engine would draw every text twice to place it
    fig.subplots_adjust(left=0.17, right=0.97, top=0.9, bottom=0.08, wspace=0.25)
    axes = np.atleast_1d(fig.subplots(1, len(plotted)))
    every = max(1, -(-len(targets) // MAX_NAMED_ROWS))
    at = [series[t]["steps"] for t in targets]  # each target's cells, found once for every panel
    steps = np.unique(np.concatenate(at)) if targets else np.zeros(0, np.int64)
    cells = (np.repeat(np.arange(len(targets)), [len(a) for a in at]),
             np.searchsorted(steps, np.concatenate(at)) if targets else np.zeros(0, np.int64))
    for ax, st in zip(axes, plotted):
        m = np.full((len(targets), len(steps)), np.nan)
        if targets:
            m[cells] = np.concatenate([series[t][st.name] for t in targets])
        m = st.plot.scale * np.where(np.isfinite(m), np.clip(m, -PLOT_MAX, PLOT_MAX), np.nan)
        positive = m[m > 0]
        log = st.plot.log and positive.size and not (m <= 0).any()
        norm = _matplotlib("colors").LogNorm(positive.min(), max(positive.max(), positive.min() * (1 + 1e-9))) \
            if log else None
        im = ax.imshow(np.ma.masked_invalid(m), aspect="auto", interpolation="nearest", cmap="viridis", norm=norm,
                       extent=(-0.5, len(steps) - 0.5, len(targets) - 0.5, -0.5))
        axis_marks.mark_scale(fig.colorbar(im, ax=ax, shrink=0.8, pad=0.02))
        image_title(ax, st.plot.label)
        ticks = np.unique(np.linspace(0, len(steps) - 1, min(len(steps), 8)).round().astype(int)) if len(steps) else []
        labels = [str(steps[i]) for i in ticks]
        axis_marks.mark(ax, "bottom", ticks, labels, fontsize=7)
        ax.set_xlabel("step")
        axis_marks.place_label(ax, "bottom", axis_marks.label_room(labels, 7, "bottom"))
        ax.set_yticks([])
    name_rows(axes[0], targets, every)  # the names once, beside the first panel
    fig.suptitle(f"layer stats over steps ({kind or 'all kinds'}, {len(targets)} targets, one row each)")
    return save_figure(fig, path)


LINE_STYLES = ("-", "--", ":", "-.")


def line_style(k):
    """Target k's color and line style: tab10's qualitative colors, the style changing every 10 targets
    (40 distinct pairs, then they repeat)."""
    return {"color": _cmap("tab10")(k % 10), "ls": LINE_STYLES[(k // 10) % len(LINE_STYLES)]}


def data_limits(values, bounds):
    """y limits of a bounded panel (e.g. 0..100 %): the finite data's range with a 5 % margin, within the bounds
    (at least 1/10000 of their span, so constant data is a visible line, not a collapsed axis)."""
    v = np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in values]) if values else np.array([])
    v = v[np.isfinite(v)]
    if not v.size:
        return bounds
    lo, hi = float(v.min()), float(v.max())
    pad = max(0.05 * (hi - lo), 1e-4 * (bounds[1] - bounds[0]))
    return max(bounds[0], lo - pad), min(bounds[1], hi + pad)


def _panels(series, targets):
    """The statistics of the layer-stats panels: statistics.PLOTTED, a statistic with Plot.instead_of drawn
    in that one's panel when some target has values of it (near_zero_rel for near_zero)."""
    instead = {st.plot.instead_of: st for st in statistics.PLOTTED if st.plot.instead_of}
    out = []
    for st in statistics.PLOTTED:
        if st.plot.instead_of:
            continue
        alt = instead.get(st.name)
        has = alt is not None and any(np.isfinite(series[t][alt.name]).any() for t in targets)
        out.append(alt if has else st)
    return out


# ---- histogram heatmaps ----
@literal_text
def plot_hist_heatmap(series, path=None, targets=None, hist="linear", kind=Kind.OUTPUT.value, max_targets=None,
                      ncols=3):
    """Per target, the histogram of each step as one column (fastai's color_dim), in a grid that grows with the
    targets (max_targets: the first ones, and the title says how many of how many; targets without histograms are
    named in the title). A column's color is the share of that step's values in each bin (its counts over their
    sum, so a step that holds more values is not brighter), on one log scale from SHARE_MIN to 1 that the color
    bar shows; empty bins take the lowest color.
    hist="linear": the value bins (the configured linear histogram, else the view of the float buckets over one
    span for the steps shown); hist="log2": log2 `|x|` (zeros and values below 2**-126 in the bottom row).
    One column per record that has the histogram, its step under it: each step that counted the histograms, with
    its own values (steps between histogram steps, hist_every, have none)."""
    from . import axis_marks
    if hist not in ("linear", "log2"):
        raise ValueError(f"hist must be 'linear' or 'log2', got {hist!r}")
    if targets is None:
        targets = [t for t, s in series.items() if kind is None or s["kind"] == kind]
    without = [t for t in targets if t in series and _hist_key(series[t], hist) is None]
    targets, total = _pick(series, [t for t in targets if t not in without], None, max_targets)
    nrows = max(1, math.ceil(len(targets) / ncols))
    head = 0.8 + 0.2 * bool(without)  # inches above the panels for the title, whatever the grid's height
    height = head + 2.6 * nrows
    fig = new_figure(figsize=(4.6 * ncols, height))
    top, bottom = 1 - head / height, 0.6 / height
    bar_x, bar_w = axis_marks.bar_place(fig, SHARE_MARKS, 8)
    fig.subplots_adjust(left=0.06, right=bar_x - 0.3 / fig.get_figwidth(), top=top, bottom=bottom, hspace=0.45,
                        wspace=0.25)
    grid = fig.add_gridspec(nrows, ncols)  # a panel per target, none in the last row's empty places
    axes = [fig.add_subplot(grid[k // ncols, k % ncols]) for k in range(len(targets))]
    cmap = _cmap("viridis").with_extremes(bad=_cmap("viridis")(0.0), under=_cmap("viridis")(0.0))
    norm = _matplotlib("colors").LogNorm(vmin=SHARE_MIN, vmax=1.0)
    for ax, t in zip(axes, targets):
        s = series[t]
        key = _hist_key(s, hist)
        counts = s[key].astype(np.float64)
        steps = s[key + "_steps"]
        x0, x1 = -0.5, len(steps) - 0.5  # one column per histogram record, whatever the steps between them
        if hist == "linear":
            edges = s["hist_edges"] if key == "hist" else s["float_view_edges"]
            y0, y1, ylabel = edges[0], edges[-1], "value"
        else:
            used = np.flatnonzero(counts[:, 2:].sum(0))
            lo, hi = (used[0], used[-1] + 1) if used.size else (0, 1)
            zero_row = counts[:, :2].sum(1, keepdims=True)
            counts = np.concatenate([zero_row, counts[:, 2 + lo: 2 + hi]], axis=1)
            y0, y1, ylabel = lo + layout.LOG_EXP_MIN - 1, hi + layout.LOG_EXP_MIN, "log2 |x|  (bottom row: ~0)"
        image = ax.imshow(column_shares(counts).T, origin="lower", aspect="auto", cmap=cmap, norm=norm,
                          extent=(x0, x1, y0, y1), interpolation="nearest")
        if hist == "log2":
            ax.axhline(y0 + 1, color="white", lw=0.8)
        image_title(ax, short(t), fontsize=9)
        ticks = np.unique(np.linspace(0, len(steps) - 1, min(len(steps), MAX_STEP_TICKS)).round().astype(int))
        ax.set_xticks(ticks, [str(steps[i]) for i in ticks], fontsize=7)
    # the axis names once per column and row of the grid (the same words on every panel: two texts a panel to lay
    # out and draw); each panel keeps its own ticks, its steps and its span
    for k, ax in enumerate(axes):
        if k + ncols >= len(axes):
            ax.set_xlabel("histogram step", fontsize=8)
        if k % ncols == 0:
            ax.set_ylabel(ylabel, fontsize=8)
    title = (f"{'linear' if hist == 'linear' else 'log2-magnitude'} histogram over steps ({kind or 'all kinds'}, "
             f"{_count(len(targets), total)}); color: share of each column's values")
    if without:
        more = f" and {len(without) - 5} more" if len(without) > 5 else ""
        title += f"\nno histogram: {', '.join(map(short, without[:5]))}{more}"
    fig.suptitle(title, y=1 - 0.15 / height, va="top")
    if targets:
        axis_marks.mark_scale(fig.colorbar(image, cax=fig.add_axes((bar_x, bottom, bar_w, top - bottom))),
                              "share of the column's values in the bin (log scale)", label_size=8)
    return save_figure(fig, path)


SHARE_MIN = 1e-4  # the heatmaps' color scale starts here: a bin holding 1 value in 10,000
SHARE_MARKS = [f"{SHARE_MIN:.3g}"]  # the longest mark of that scale (axis_marks.mark_scale's decades)


@literal_text
def plot_hist_overview(series, path=None, hist="linear", kind=Kind.OUTPUT.value):
    """plot_hist_heatmap for runs with more targets than panels can show: two images, each target's first and last
    histogram record (row = target in forward order, column = bin, color = the share of the record's values in the
    bin, the heatmaps' log scale). hist="log2": the columns are log2 `|x|` for every row (the first: ~0);
    hist="linear": each row's own bins (the configured ones, or its view of the float buckets), so a column is a
    place within the target's span, not one value. One figure of two images whatever the number of targets."""
    if hist not in ("linear", "log2"):
        raise ValueError(f"hist must be 'linear' or 'log2', got {hist!r}")
    from . import axis_marks
    targets = [t for t, s in series.items() if (kind is None or s["kind"] == kind) and _hist_key(s, hist) is not None]
    ends = [series[t][_hist_key(series[t], hist)][[0, -1]].astype(np.float64) for t in targets]  # [2, bins] each
    if hist == "log2" and ends:
        both = np.stack(ends)  # [T, 2, LOG_SLOTS]
        used = np.flatnonzero(both[:, :, 2:].sum((0, 1)))
        lo, hi = (used[0], used[-1] + 1) if used.size else (0, 1)
        both = np.concatenate([both[:, :, :2].sum(2, keepdims=True), both[:, :, 2 + lo: 2 + hi]], axis=2)
        extent_x = (lo + layout.LOG_EXP_MIN - 1, hi + layout.LOG_EXP_MIN)
    else:
        width = max((e.shape[1] for e in ends), default=1)
        both = np.full((len(targets), 2, width), np.nan)
        for r, e in enumerate(ends):
            both[r, :, : e.shape[1]] = e
        extent_x = (-0.5, width - 0.5)
    fig = new_figure(figsize=(15, 7))  # fixed margins: a layout engine would draw every text twice to place it
    bar_x, bar_w = axis_marks.bar_place(fig, SHARE_MARKS, 8)
    fig.subplots_adjust(left=0.17, right=bar_x - 0.3 / 15, top=0.88, bottom=0.09, wspace=0.08)
    axes = fig.subplots(1, 2)  # the same rows on both: the names once, no ticks on the second (a tick object per row)
    cmap = _cmap("viridis").with_extremes(bad=_cmap("viridis")(0.0), under=_cmap("viridis")(0.0))
    norm = _matplotlib("colors").LogNorm(vmin=SHARE_MIN, vmax=1.0)
    n = len(targets)
    for k, (ax, which) in enumerate(zip(axes, ("first", "last"))):
        image = ax.imshow(column_shares(both[:, k, :]) if n else np.zeros((0, 1)), aspect="auto", cmap=cmap,
                          norm=norm, interpolation="nearest", extent=(*extent_x, n - 0.5, -0.5))
        image_title(ax, f"each target's {which} histogram record", fontsize=9)
        labels = axis_marks.mark_span(ax, "bottom", *extent_x, integer=True)
        ax.set_xlabel("log2 |x|  (first column: ~0)" if hist == "log2" else "bin of the target's own span", fontsize=8)
        axis_marks.place_label(ax, "bottom", axis_marks.label_room(labels, None, "bottom"))
    name_rows(axes[0], targets, max(1, -(-n // MAX_NAMED_ROWS)))
    axes[1].set_yticks([])
    fig.suptitle(f"{'linear' if hist == 'linear' else 'log2-magnitude'} histograms ({kind or 'all kinds'}, {n} "
                 f"targets, one row each); color: share of the record's values")
    if n:
        axis_marks.mark_scale(fig.colorbar(image, cax=fig.add_axes((bar_x, 0.09, bar_w, 0.79))),
                              "share of the record's values in the bin (log scale)", label_size=8)
    return save_figure(fig, path)


def column_shares(counts):
    """counts [steps, bins] as each step's share per bin (its row over the row's sum); NaN rows where a step holds
    no values."""
    counts = np.asarray(counts, dtype=np.float64)
    total = counts.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, counts / total, np.nan)


def _hist_key(s, hist):
    """The series' histogram for a heatmap of kind `hist`, or None: the configured linear bins before the view
    of the float buckets."""
    keys = ("hist", "float_view") if hist == "linear" else ("log2_hist",)
    return next((k for k in keys if s.get(k) is not None), None)


# ---- dynamic range ----
def format_ranges():
    """{name: (smallest subnormal, smallest normal, max)} of each low-precision format."""
    return dict(FORMATS)


def range_shares(log2_hist):
    """Share of the finite values (zeros included) that each format cannot hold, from the log2 bins:
    underflow = nonzero `|x|` below its smallest subnormal (rounds to 0 or to that subnormal); subnormal =
    `|x|` in [smallest subnormal, smallest normal) (precision lost); overflow = `|x|` >= 2**(e+1) above its
    max 2**e * (2 - ulp), a lower bound (the bin holding max itself is counted as in range). bf16's
    smallest subnormal (2**-133) lies inside slot 1 (all nonzero `|x|` below 2**-126): its underflow share
    counts none of them, a lower bound too."""
    h = np.asarray(log2_hist, dtype=np.float64)
    total = h.sum()
    # upper edge (log2) of each slot: slot 1 -> -126, slot 2+k -> k-125
    upper = np.concatenate([[-np.inf, layout.LOG_EXP_MIN], np.arange(layout.LOG_SLOTS - 2) + layout.LOG_EXP_MIN + 1])
    lower = upper - 1
    out = {}
    for name, (sub, normal, mx) in format_ranges().items():
        ls, ln, lm = math.log2(sub), math.log2(normal), math.floor(math.log2(mx)) + 1
        nonzero = np.arange(layout.LOG_SLOTS) >= 1
        under = h[nonzero & (upper <= ls)].sum()
        subn = h[nonzero & (lower >= ls) & (upper <= ln)].sum()
        over = h[lower >= lm].sum()
        out[name] = {k: (v / total if total else math.nan) for k, v in
                     (("underflow", under), ("subnormal", subn), ("overflow", over))}
    return out


def shares_of(hist):
    """{format: {underflow, subnormal, overflow}} of a histogram: float buckets (buckets.dtype_shares: exact
    or lower bounds, see there) or, from a run saved without them, log2 bins (range_shares)."""
    h = np.asarray(hist)
    if h.shape[-1] != layout.FLOAT_SLOTS:
        return range_shares(h)
    got = buckets.dtype_shares(h.astype(np.int64))
    return {f: {k: float(got[f][k]) for k in ("underflow", "subnormal", "overflow")} for f in FORMATS}


def _log2_of(hist):
    h = np.asarray(hist)
    return buckets.log2_hist(h.astype(np.int64)) if h.shape[-1] == layout.FLOAT_SLOTS else h


@literal_text
def plot_dynamic_range(by_target, path=None, max_targets=None):
    """Left: each target's log2 `|x|` distribution (one row per target, forward order; max_targets: the first
    ones, and the title says how many of how many) with each format's range marked (solid: smallest
    subnormal and max; dashed: smallest normal). Right: under/overflow % per format. by_target: {target:
    float buckets [4096]} (totals()), or log2 histograms [256] of a run saved without float buckets."""
    from . import axis_marks
    targets, total = _cap(by_target, max_targets)
    raw = [np.asarray(by_target[t]) for t in targets]
    exact = all(h.shape[-1] == layout.FLOAT_SLOTS for h in raw)
    if targets and exact:  # every target's float buckets: one call over all of them
        stacked = np.stack(raw).astype(np.int64)
        hists = buckets.log2_hist(stacked).astype(np.float64)
    else:
        hists = np.stack([np.asarray(_log2_of(h), dtype=np.float64) for h in raw]) if targets \
            else np.zeros((0, layout.LOG_SLOTS))
    used = np.flatnonzero(hists[:, 2:].sum(0)) if len(targets) else np.array([], dtype=int)
    lo = min((used[0] if used.size else 100) + layout.LOG_EXP_MIN, -26) - 2
    hi = max((used[-1] + 1 if used.size else 100) + layout.LOG_EXP_MIN, 17) + 2
    k0, k1 = lo - layout.LOG_EXP_MIN, hi - layout.LOG_EXP_MIN
    strip = hists[:, 2 + k0: 2 + k1]
    strip = strip / np.maximum(strip.max(1, keepdims=True), 1)
    Line2D = _matplotlib("lines").Line2D
    labelled = len(targets) <= MAX_LABELLED_ROWS
    # labelled: a row tall enough for the shares written in it; past that only every k-th name, 0.35 in apart (a
    # taller image only costs pixels to draw and encode)
    height = 2.4 + 0.42 * max(len(targets), 4) if labelled else 2.7 + 0.35 * MAX_NAMED_ROWS
    legend_y = -0.16 * 6 / max(min(len(targets), MAX_LABELLED_ROWS), 4) if labelled else -0.4 / (height - 2.7)
    # the layout engine draws every text twice to place it (most of the chart's time past a few hundred rows):
    # fixed margins then, room below for the legend
    fig = new_figure(figsize=(16, height), layout="constrained" if labelled else None)
    if not labelled:
        fig.subplots_adjust(left=0.12, right=0.97, top=1 - 0.5 / height, bottom=2.2 / height, wspace=0.12)
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    n = len(targets)
    left.imshow(strip, aspect="auto", cmap="Greys", extent=(lo, hi, n - 0.5, -0.5), interpolation="nearest",
                vmin=0, vmax=1)
    handles = []
    for name, (sub, normal, mx) in format_ranges().items():
        c = FORMAT_COLORS[name]
        shown = False
        for v, style in ((sub, "-"), (mx, "-"), (normal, "--")):
            if lo <= math.log2(v) <= hi:
                left.axvline(math.log2(v), color=c, ls=style, lw=1.3, alpha=0.85)
                shown = True
        label = f"{name}: {sub:.3g} (2^{math.log2(sub):.0f}) .. {mx:.4g}" + ("" if shown else "  (beyond the axis)")
        handles.append(Line2D([], [], color=c, lw=1.3, label=label))
    if labelled:
        left.set_yticks(range(n), [short(t) for t in targets], fontsize=7)
    else:
        name_rows(left, targets, -(-n // MAX_NAMED_ROWS), fontsize=7, axis_label=None)
    left.set_xlim(lo, hi)
    if not labelled:
        room = axis_marks.label_room(axis_marks.mark_span(left, "bottom", lo, hi, integer=True), None, "bottom")
    left.set_xlabel("log2 |x|   (grey: share of the target's values per power of two; solid: smallest subnormal "
                    "and max, dashed: smallest normal)")
    if not labelled:
        axis_marks.place_label(left, "bottom", room)
    left.legend(handles=handles, loc="upper left", bbox_to_anchor=(0, legend_y), ncol=2, fontsize=8,
                title="representable range", title_fontsize=8, frameon=False)
    image_title(left, f"dynamic range per target ({_count(n, total)})")

    cols = [(f, k) for f in FORMATS for k in ("underflow", "overflow")]
    if targets and exact:
        got = buckets.dtype_shares(stacked)
        mat = np.stack([np.asarray(got[f][k], dtype=np.float64) for f, k in cols], axis=1) * 100
    else:
        shares = [shares_of(h) for h in raw]
        mat = np.array([[s[f][k] for f, k in cols] for s in shares]) * 100 if shares else np.zeros((0, len(cols)))
    im = right.imshow(np.nan_to_num(mat), aspect="auto", cmap="Reds", vmin=0,
                      vmax=max(1.0, np.nanmax(mat, initial=0)))
    if not labelled:
        axis_marks.mark_scale(fig.colorbar(im, ax=right, shrink=0.6), "%")
    for i in range(mat.shape[0] if labelled else 0):  # past that, the colors alone (the bar gives the scale)
        for j in range(mat.shape[1]):
            v = mat[i, j]
            right.text(j, i, "-" if math.isnan(v) else (f"{v:.3g}" if v else "0"), ha="center", va="center",
                       fontsize=7)
    col_labels = [f"{f}\n{'under' if k == 'underflow' else 'over'}" for f, k in cols]
    if labelled:
        right.set_xticks(range(len(cols)), col_labels, fontsize=7)
    else:
        axis_marks.mark(right, "bottom", range(len(cols)), col_labels, fontsize=7)
    right.set_yticks([])  # the left image's rows, its names beside them (a tick object per row drew nothing here)
    image_title(right, "% of values out of range" + (" (fp16 overflow, bf16: at least)" if exact
                                                    else " (overflow and bf16 underflow: at least)"))
    return save_figure(fig, path)


def _cmap(name):
    return _matplotlib().colormaps[name]


_KIND_IN_ID = re.compile(f":({'|'.join(sorted(KINDS, key=len, reverse=True))})" + r"(?=$|[\[.@])")


def kind_of(target_id):
    """The kind in a target id ("module:kind", then a leaf path "[0]"/".field" and "@call" where present)."""
    found = _KIND_IN_ID.findall(target_id)
    return found[0] if found else "?"


def _file_part(kind, kinds):
    """The part of a chart's file name that says its kind: a Kind's value, else (a kind from a file or a user's
    series, never part of a path) `kind<its index>`."""
    return kind if kind in KINDS or kind == "" else f"kind{kinds.index(kind)}"


def save_all(series, out_dir, run_totals=None, progress=None):
    """Every chart of a run as PNG files in out_dir; returns their paths. run_totals: {target: float buckets
    (or log2 hist)} of the whole run (default: totals(), summed from the recorded steps). progress: wraps the list of charts to draw
    (e.g. hookstats.tools.progress.progress, a bar)."""
    from functools import partial
    from pathlib import Path
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    charts = []  # (file name, draw(path))
    kinds = list(dict.fromkeys(s["kind"] for s in series.values()))
    for kind in kinds:
        many = sum(s["kind"] == kind for s in series.values()) > MAX_LINES
        charts.append((f"layer_stats_{_file_part(kind, kinds)}.png",
                       partial(plot_layer_stats_overview if many else plot_layer_stats, series, kind=kind)))
        for hist in ("linear", "log2"):
            if any(s["kind"] == kind and _hist_key(s, hist) is not None for s in series.values()):
                draw = partial(plot_hist_overview, series, hist=hist, kind=kind) if many else \
                    partial(plot_hist_heatmap, series, hist=hist, kind=kind, max_targets=MAX_PANELS)
                charts.append((f"hist_{hist}_{_file_part(kind, kinds)}.png", draw))
    log2 = run_totals if run_totals is not None else totals(series)
    # one chart per kind: "dynamic_range.png" holds the forward outputs, the activations a lower precision
    # would store; the others are named after their kind
    by_kind = {}
    for t, h in log2.items():
        by_kind.setdefault(series[t]["kind"] if t in series else kind_of(t), {})[t] = h
    for kind in sorted(by_kind, key=lambda k: (k != Kind.OUTPUT, kinds.index(k) if k in kinds else len(kinds))):
        name = "dynamic_range.png" if kind == Kind.OUTPUT or len(by_kind) == 1 else \
            f"dynamic_range_{_file_part(kind, list(by_kind))}.png"
        charts.append((name, partial(plot_dynamic_range, by_kind[kind])))
    paths = []
    for name, draw in (progress or iter)(charts):
        draw(path=out / name)
        paths.append(out / name)
    return paths
