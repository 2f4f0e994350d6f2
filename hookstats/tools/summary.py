"""summary(model, *inputs): one row per layer with type, output shape, parameter count and trainable, plus
the live statistics of an attached monitor (fastai's module_summary/layer_info); model_sizes and
num_features; stats_table() prints per-target statistics for the demo and `hookstats report` (head_and_tail: the
first and last rows of a long one)."""
import math

import torch
from torch import nn

from ..names import short
from ..records import value
from ..state import Kind
from ..tensors import tensor_leaves
from . import lowprec_cells


class Summary:
    """The rows of summary(); str() is the table, to_frame() a pandas DataFrame."""

    def __init__(self, rows, columns, title):
        self.rows, self.columns, self.title = rows, columns, title

    def __str__(self):
        return format_table(self.rows, self.columns, self.title)

    __repr__ = __str__

    def to_frame(self):
        from ..extras import require
        return require("pandas", "Summary.to_frame()").DataFrame(self.rows, columns=self.columns)


def _layers(model):
    """Leaf modules, and containers with parameters of their own, in registration order."""
    return {n: m for n, m in model.named_modules()
            if n and (not any(True for _ in m.children()) or any(True for _ in m.parameters(recurse=False)))}


def _shape(out):
    shapes = [tuple(t.shape) for _, t in tensor_leaves(out)]
    if not shapes:
        return "-"
    return str(list(shapes[0])) if len(shapes) == 1 else " ".join(str(list(s)) for s in shapes[:3]) + \
        (" ..." if len(shapes) > 3 else "")


def _run(model, inputs, kwargs, monitor):
    """Output shape of each layer from one no-grad eval-mode forward; every training flag is restored and
    an attached monitor is paused, so neither BatchNorm statistics nor the monitor's state change."""
    layers = _layers(model)
    shapes, order, handles = {}, [], []
    for name, m in layers.items():
        def hook(mod, args, out, name=name):
            if name not in shapes:
                order.append(name)
            shapes[name] = _shape(out)
        handles.append(m.register_forward_hook(hook))
    modes = {m: m.training for m in model.modules()}
    was_paused = monitor is not None and monitor.paused
    if monitor is not None:
        monitor.pause()
    try:
        model.eval()
        with torch.no_grad():
            out = model(*inputs, **kwargs)
    finally:
        for h in handles:
            h.remove()
        for m, mode in modes.items():
            m.training = mode
        if monitor is not None and not was_paused:
            monitor.resume()
    return layers, shapes, order, out


def summary(model, *example_inputs, monitor=None, lowprec_threshold=lowprec_cells.DEFAULT_THRESHOLD,
            **example_kwargs):
    """A table of the model's layers (forward order, then layers not called): name, type, output shape,
    parameters, trainable; with a monitor (monitor=, or the one attached to the model), also each layer's
    output mean/std/near-zero %/non-finite count and gradient std so far, and with float buckets the formats in
    which its output or gradient would lose (underflow + overflow, unscaled or with current scaling) more than
    `lowprec_threshold` of its values. Runs one no-grad eval forward on the example inputs."""
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be an nn.Module, got {type(model).__name__}")
    lowprec = lowprec_cells.column(lowprec_cells.check_threshold(lowprec_threshold))
    if monitor is None:
        from ..monitor import attached_monitor
        monitor = attached_monitor(model)
    layers, shapes, order, _ = _run(model, example_inputs, example_kwargs, monitor)
    stats = monitor.stats() if monitor is not None else {}
    rows = []
    for name in order + [n for n in layers if n not in shapes]:
        m = layers[name]
        own = list(m.parameters(recurse=False))
        row = {"layer": name, "type": type(m).__name__, "output shape": shapes.get(name, "not called"),
               "params": sum(p.numel() for p in own),
               "trainable": ("yes" if all(p.requires_grad for p in own) else
                             "partly" if any(p.requires_grad for p in own) else "no") if own else "-"}
        if monitor is not None:
            o, g = _target(stats, name, Kind.OUTPUT), _target(stats, name, Kind.GRAD_OUTPUT)
            row.update({"mean": o["mean"] if o else None, "std": o["std"] if o else None,
                        "near zero %": 100 * o["near_zero"] if o else None, **_float_cells(o),
                        "nan/inf": o["nan"] + o["posinf"] + o["neginf"] if o else None,
                        "grad std": g["std"] if g else None,
                        lowprec: lowprec_cells.losing([o, g], lowprec_threshold)})
        rows.append(row)
    columns = ["layer", "type", "output shape", "params", "trainable"]
    if monitor is not None:
        columns += ["mean", "std", "near zero %", *_float_columns(rows), "nan/inf", "grad std"]
        columns += [lowprec] if any(r.get(lowprec) is not None for r in rows) else []
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    title = f"{type(model).__name__}: {total:,} parameters ({trainable:,} trainable)"
    return Summary(rows, columns, title)


def _target(stats, module, kind):
    """The module's plain-tensor target, else its first tuple/dict leaf (e.g. attention's output[0])."""
    return stats.get(f"{module}:{kind}") or next(
        (r for r in stats.values() if r["module"] == module and r["kind"] == kind), None)


def model_sizes(model, *example_inputs, **example_kwargs):
    """Output shape of each layer in forward order (fastai's model_sizes), as tuples."""
    sizes, handles = [], []
    for m in _layers(model).values():
        handles.append(m.register_forward_hook(lambda mod, a, out: sizes.append(
            next((tuple(t.shape) for _, t in tensor_leaves(out)), None))))
    try:
        _run(model, example_inputs, example_kwargs, None)
    finally:
        for h in handles:
            h.remove()
    return sizes


def num_features(model, *example_inputs, **example_kwargs):
    """Size of dimension 1 of the model's (first) output: the channels of a CNN body (fastai's
    num_features_model), the width of a linear head."""
    out = _run(model, example_inputs, example_kwargs, None)[3]
    t = next((t for _, t in tensor_leaves(out)), None)
    if t is None or t.dim() < 2:
        raise ValueError("the model's output has no dimension 1")
    return int(t.shape[1])


def format_number(v):
    if v is None:
        return "-"
    if isinstance(v, bool) or isinstance(v, str):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if math.isnan(v):
        return "nan"
    return f"{v:.4g}"


def format_table(rows, columns, title=None):
    """A plain-text table with right-aligned numbers."""
    cells = [[format_number(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    numeric = [all(isinstance(r.get(c), (int, float)) or r.get(c) is None for r in rows) for c in columns]

    def line(vals):
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(vals, widths, numeric)).rstrip()

    out = ([title] if title else []) + [line(columns), line(["-" * w for w in widths])] + [line(c) for c in cells]
    return "\n".join(out)


def head_and_tail(table, n, note):
    """format_table()'s text with only its first and last n rows (more than 2n + 10 rows), the rows between them
    one line saying how many and `note` (e.g. where the whole table is); a table of fewer rows whole."""
    lines = table.splitlines()
    top = next(i for i, ln in enumerate(lines) if ln and set(ln) <= {"-", " "}) + 1  # the rule under the header
    rows = len(lines) - top
    if rows <= 2 * n + 10:
        return table
    cut = f"... {rows - 2 * n:,} of {rows:,} rows left out here; {note}"
    return "\n".join(lines[: top + n] + [cut] + lines[-n:])


# from the float buckets: the relative near-zero figure (hookstats/buckets.py) and quantiles of |x|
FLOAT_CELLS = {"near 0 rel %": ("near_zero_rel", 100), "p1 |x|": ("abs_p1", 1), "p50 |x|": ("abs_p50", 1),
               "p99 |x|": ("abs_p99", 1)}


def _float_cells(rec):
    """The FLOAT_CELLS of a record (None where it has no float buckets)."""
    rec = rec or {}
    return {c: None if rec.get(k) is None else scale * rec[k] for c, (k, scale) in FLOAT_CELLS.items()}


def _float_columns(rows):
    """FLOAT_CELLS' columns when some row has them (a monitor with float buckets, a run saved with them)."""
    return list(FLOAT_CELLS) if any(r.get(c) is not None for r in rows for c in FLOAT_CELLS) else []


def stats_table(records, title=None):
    """One line per target from stats() values or history records: mean, std, rms and L2 norm (of the finite
    values), near-zero % (|x| <= eps), with
    float buckets the relative near-zero % and the p1/p50/p99 of |x|, then min, max, non-finite count."""
    rows = []
    for rec in records:
        near_zero, nonfinite = value(rec, "near_zero"), value(rec, "nonfinite")
        rows.append({"target": short(rec["target"]),
                     **{k: value(rec, k) for k in ("count", "mean", "std", "rms", "l2")},
                     "near zero %": None if near_zero is None else 100 * near_zero, **_float_cells(rec),
                     "min": value(rec, "min"), "max": value(rec, "max"), "nan/inf": int(nonfinite or 0)})
    return format_table(rows, ["target", "count", "mean", "std", "rms", "l2", "near zero %", *_float_columns(rows), "min", "max",
                               "nan/inf"], title)
