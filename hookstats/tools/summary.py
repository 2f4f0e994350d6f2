"""summary(model, *inputs): one row per layer with type, output shape, parameter count and trainable, plus
the live statistics of an attached monitor (fastai's module_summary/layer_info); model_sizes and
num_features. The text tables (stats_table, format_table, head_and_tail) are tables.py's, named here too."""
import torch
from torch import nn

from ..state import Kind
from ..tensors import tensor_leaves
from . import lowprec_cells
# stats_table, format_number and head_and_tail: hookstats.tools.summary's names too
from .tables import float_cells, float_columns, format_number, format_table, head_and_tail, stats_table  # noqa: F401


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
                        "near zero %": 100 * o["near_zero"] if o else None, **float_cells(o),
                        "nan/inf": o["nan"] + o["posinf"] + o["neginf"] if o else None,
                        "grad std": g["std"] if g else None,
                        lowprec: lowprec_cells.losing([o, g], lowprec_threshold)})
        rows.append(row)
    columns = ["layer", "type", "output shape", "params", "trainable"]
    if monitor is not None:
        columns += ["mean", "std", "near zero %", *float_columns(rows), "nan/inf", "grad std"]
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
