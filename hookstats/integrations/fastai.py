"""ActivationStats for fastai, computed by hookstats: a drop-in for fastai.callback.hook.ActivationStats
(same arguments, `stats`, `layer_stats`, `hist`, `color_dim`, `plot_layer_stats`) with no host sync per
batch: per-batch statistics go through hookstats' device-side history and reach `stats` when read."""
import torch

from ..extras import require

require("fastai", "hookstats.integrations.fastai")
from fastai.callback.hook import ActivationStats as FastaiActivationStats  # noqa: E402
from fastai.callback.hook import has_params  # noqa: E402
from fastai.layers import ParameterModule, flatten_model  # noqa: E402
from fastcore.foundation import L  # noqa: E402

import hookstats  # noqa: E402
from hookstats.config import check_arg, check_count  # noqa: E402
from hookstats.selection import module_names  # noqa: E402
from hookstats.state import Kind  # noqa: E402

# fastai's numbers: near_zero = mean(o <= 0.05), hist = o.histc(40, 0, 10): the exact linear bins (not the float
# buckets' fitted view), counted only with with_hist, on every batch whatever the defaults; the float buckets only
# when asked for (float_hist=True)
FASTAI_CONFIG = dict(eps=0.05, near_zero="le", hist_every=1)
FASTAI_BINS = dict(nbins=40, lo=0.0, hi=10.0)


class ActivationStats(FastaiActivationStats):
    """fastai's ActivationStats, measured by one fused hookstats op per module output instead of three
    `.item()` calls and a host copy per module per batch.

    Each entry of `stats` (one per measured training batch) lists, per hooked module, a dict with fastai's
    `mean`, `std` (unbiased), `near_zero` (fraction of values <= 0.05) and, with with_hist, `hist` (40
    float32 counts over [0, 10]; values outside are not counted). Differences from fastai, by design:
    a value exactly 10.0 is counted by fastai's histc in its last bin and by hookstats as overflow (its bins
    are half-open: [lo, hi) is binned, hi and above overflow); mean and std are float64 over the finite
    values (fastai's are float32 and NaN/Inf propagate into them). detach and cpu are accepted and
    ignored: nothing is copied. is_forward=False measures each module's output gradient. `monitor` is the
    hookstats Monitor, for everything else (min/max, NaN/Inf counts). log_every: batches between the
    device-to-host transfers of the per-batch statistics (reading `stats` transfers too).

    What it counts is what fastai's numbers need, so that it costs less than fastai's callback: the linear bins
    only with with_hist, no float buckets. float_hist=True adds them (and, from them, the quantiles, the
    relative near-zero share and the log2 histogram in `monitor`'s records) at the op's cost of one more
    increment per value (benchmarks/fastai_dropin.py).
    """

    def __init__(self, with_hist=False, modules=None, every=None, remove_end=True, is_forward=True, detach=True,
                 cpu=True, include_paramless=False, log_every=50, float_hist=False):
        super().__init__(with_hist=with_hist, modules=modules, every=every, remove_end=remove_end,
                         is_forward=is_forward, detach=detach, cpu=cpu, include_paramless=include_paramless)
        check_count("every", every, optional=True)
        self.log_every, self.monitor, self._batches, self._names = log_every, None, L(), []
        self.float_hist = check_arg("float_hist", float_hist, bool)

    @property
    def stats(self):
        if self.monitor is not None:
            self.monitor.flush()
        return self._batches

    @stats.setter
    def stats(self, value):
        self._batches = value

    def before_fit(self):
        if self.modules is None:
            self.modules = [m for m in flatten_model(self.model) if self.include_paramless or has_params(m)]
        names = {id(m): n for n, m in module_names(self.model).items()}  # the root as hookstats names it
        # flatten_model wraps a module's own parameters (beside its children) in a ParameterModule that is never
        # called: fastai's entry for it is None every batch, and so is ours
        lone = {id(m) for m in self.modules if isinstance(m, ParameterModule) and id(m) not in names
                and any(m.val is p for p in self.model.parameters())}
        missing = [type(m).__name__ for m in self.modules if id(m) not in names and id(m) not in lone]
        if missing:
            raise ValueError(f"ActivationStats: modules {missing} are not modules of learn.model")
        self._names = [None if id(m) in lone else names[id(m)] for m in self.modules]
        self._batches = L()
        self.monitor = hookstats.attach(
            self.model, modules=[n for n in self._names if n is not None], steps="manual", every=self.every or 1, outputs=self.is_forward,
            grads=not self.is_forward, history=True, log_every=self.log_every, sinks=[_BatchSink(self)],
            alerts=False, float_hist=self.float_hist, log_hist=self.float_hist,
            **FASTAI_CONFIG, **(FASTAI_BINS if self.with_hist else {"linear_hist": False}))

    def after_batch(self):
        # train_iter is the index of this batch: TrainEvalCallback (order -10) increments it after us
        if self.training and self.monitor is not None and self.monitor.attached:
            self.monitor.step()

    def after_fit(self):
        if self.remove_end:
            self._remove()

    def _register(self):
        pass  # hookstats attaches in before_fit; `every` is the monitor's

    def _remove(self):
        mon = getattr(self, "monitor", None)
        if mon is not None and mon.attached:
            mon.remove()  # flushes the last batches into stats

    def entry(self, records):
        """fastai's per-module value for one batch: a dict, or a list of dicts for tuple outputs and
        gradients (fastai's hook gets grad_output as a tuple), None when the module was not called."""
        if not records:
            return None
        out = [self._fastai_dict(r) for r in records]
        return out if len(out) > 1 or records[0]["leaf"] or not self.is_forward else out[0]

    def _fastai_dict(self, r):
        d = {"mean": r["mean"], "std": r["std"], "near_zero": r["near_zero"]}
        if self.with_hist:
            d["hist"] = torch.as_tensor(r["hist"], dtype=torch.float32)
        return d


class _BatchSink:
    """Receives hookstats' per-step records and appends fastai-shaped entries to the callback's stats."""

    def __init__(self, cb):
        self.cb = cb

    def write(self, step, records):
        kind = Kind.OUTPUT if self.cb.is_forward else Kind.GRAD_OUTPUT
        by_module = {}
        for r in records:
            if r["kind"] == kind:
                by_module.setdefault(r["module"], []).append(r)
        self.cb._batches.append(L(self.cb.entry(by_module.get(n)) for n in self.cb._names))

    def close(self):
        pass
