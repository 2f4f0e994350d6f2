"""What the benchmarks compare: install(model) -> Installed for hookstats and for the tools people use
(fastai ActivationStats, detach-to-CPU hooks, a wandb.watch-style histogram hook). Each variant has a plain
name for the command line and a label for the tables (benchmarks/ and saved results use the labels)."""
import contextlib
import types
from typing import Callable, NamedTuple

import torch


class Installed:
    def __init__(self, after_step=None, remove=None, memory=None):
        self.after_step = after_step or (lambda: None)
        self.remove = remove or (lambda: None)
        self.memory = memory  # bytes the monitor holds, where known


def hooked_modules(model):
    """fastai's rule, shared by every variant: modules with parameters of their own."""
    return [m for m in model.modules() if next(m.parameters(recurse=False), None) is not None]


def hookstats_kwargs():
    """Every target attach() offers that is measured each step: outputs, their grads, param grads."""
    import inspect

    import hookstats
    params = inspect.signature(hookstats.attach).parameters
    return {k: True for k in ("outputs", "grads", "param_grads") if k in params}


@contextlib.contextmanager
def reference_backend():
    """Routes the monitor through the pure-PyTorch reference op (what runs when the extension is missing)."""
    from ... import accumulate, reference
    saved = accumulate.accumulate_, accumulate.accumulate_many_
    accumulate.accumulate_, accumulate.accumulate_many_ = reference.accumulate_, reference.accumulate_many_
    try:
        yield
    finally:
        accumulate.accumulate_, accumulate.accumulate_many_ = saved


# attach() keywords that switch every histogram off (the float buckets, the linear bins, the log2 slots)
NO_HISTOGRAMS = {"linear_hist": False, "log_hist": False, "float_hist": False}


def install_hookstats(model, reference=False, **config):
    import hookstats
    ctx = reference_backend() if reference else contextlib.nullcontext()
    ctx.__enter__()
    mon = hookstats.attach(model, **hookstats_kwargs(), **config)

    def remove():
        mon.remove()
        ctx.__exit__(None, None, None)
    return Installed(remove=remove, memory=lambda: monitor_bytes(mon))


def monitor_bytes(mon):
    mem = mon.memory() if hasattr(mon, "memory") else None
    if isinstance(mem, dict):
        return int(mem.get("device_bytes", 0) + mem.get("host_staging_bytes", 0))
    return int(mem) if mem is not None else None


def install_fastai(model, with_hist):
    from fastai.callback.hook import ActivationStats
    cb = ActivationStats(with_hist=with_hist)  # defaults: cpu=True, detach=True, every=None
    cb.learn = types.SimpleNamespace(model=model, training=True, train_iter=0)
    cb.before_fit()

    def after_step():
        cb.after_batch()
        cb.learn.train_iter += 1
    return Installed(after_step, cb.after_fit)


def install_store(model, to_cpu):
    """The hand-written way (fastai's Hook(cpu=True)): keep every output of every hooked module."""
    kept = []

    def hook(m, args, out):
        if isinstance(out, torch.Tensor):
            kept.append(out.detach().cpu() if to_cpu else out.detach())
    handles = [m.register_forward_hook(hook) for m in hooked_modules(model)]

    def remove():
        for h in handles:
            h.remove()
        kept.clear()
    return Installed(remove=remove)


def install_wandb_style(model, bins=64):
    """wandb.watch(log="gradients", log_freq=1): per parameter gradient, drop non-finite values, read
    min and max to the host, histc over that range, copy the counts to the host."""
    def hook(g):
        flat = g.detach().reshape(-1)
        if not torch.isfinite(flat).all():
            flat = flat[torch.isfinite(flat)]
        lo, hi = flat.min().item(), flat.max().item()
        flat.histc(bins=bins, min=lo, max=hi).cpu()
    handles = [p.register_hook(hook) for p in model.parameters() if p.requires_grad]
    return Installed(remove=lambda: [h.remove() for h in handles])


class Variant(NamedTuple):
    name: str  # on the command line
    label: str  # in tables and saved results
    install: Callable


BASELINE = "no hooks"
VARIANT_LIST = [
    Variant("none", BASELINE, lambda m: Installed()),
    Variant("hookstats", "hookstats", install_hookstats),
    Variant("hookstats-reference", "hookstats (reference op)", lambda m: install_hookstats(m, reference=True)),
    Variant("hookstats-nohist", "hookstats (histograms off)",
            lambda m: install_hookstats(m, **NO_HISTOGRAMS)),
    # the histogram cadence (StatsConfig.hist_every; "hookstats" runs the default)
    Variant("hookstats-hist1", "hookstats (histograms every step)", lambda m: install_hookstats(m, hist_every=1)),
    Variant("hookstats-hist4", "hookstats (histograms every 4th step)", lambda m: install_hookstats(m, hist_every=4)),
    Variant("hookstats-hist5", "hookstats (histograms every 5th step)", lambda m: install_hookstats(m, hist_every=5)),
    Variant("hookstats-fixedhist", "hookstats (linear + log2 histograms, no buckets)",
            lambda m: install_hookstats(m, linear_hist=True, log_hist=True, float_hist=False, hist_every=1)),
    Variant("fastai", "fastai ActivationStats", lambda m: install_fastai(m, with_hist=False)),
    Variant("fastai-hist", "fastai ActivationStats(with_hist)", lambda m: install_fastai(m, with_hist=True)),
    Variant("detach-cpu", "detach-to-CPU (store)", lambda m: install_store(m, to_cpu=True)),
    Variant("detach-device", "detach on device (store)", lambda m: install_store(m, to_cpu=False)),
    Variant("wandb-style", "wandb.watch-style grad hist", install_wandb_style),
]
VARIANTS = {v.label: v.install for v in VARIANT_LIST}  # by label, the key of every result
LABELS = {v.name: v.label for v in VARIANT_LIST}


def fastai_available():
    try:
        import fastai.callback.hook  # noqa: F401
        return True
    except ImportError:
        return False


def available_variants():
    """Labels of the variants this installation can run (the fastai ones need fastai)."""
    return [v.label for v in VARIANT_LIST if fastai_available() or not v.name.startswith("fastai")]
