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

    As in fastai, a module called more than once in a batch reports one call: the last call's output, the
    first call's gradient (the last one backward reaches). `hooks.stored` lists, per hooked module, what
    fastai's hook stored for the last measured training batch (fastai's also takes validation batches when
    every is None). Pickled with the Learner (learn.export, torch.save), it carries `stats` but not the
    monitor (None until the next fit attaches a fresh one).

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

    @property
    def hooks(self):
        return StoredHooks(self)

    def last_stored(self):
        """fastai's hooks.stored: the last measured batch's entry per module (None per module before any)."""
        batches = self.stats
        return L(batches[-1]) if len(batches) else L(None for _ in self.modules or ())

    def __getstate__(self):
        # the Learner pickles its callbacks (learn.export, torch.save): the statistics recorded so far go along,
        # the monitor (locks, device state) does not; the model's hooks pickle as no-ops (hookstats.hooks.handles)
        if self.monitor is not None:
            self.monitor.flush()
        return {**self.__dict__, "monitor": None}

    def __del__(self):
        # fastai's HookCallback removes its hooks here. Ours need not: the model's hooks reach this callback
        # (through the monitor's sink), so it is collected only with its model. And must not: ending the open
        # step takes views of temporary tensors, and torch aborts on that (THPVariable_clear's use_count
        # assert) inside the interpreter's last collection, where a callback left on (remove_end=False) ends.
        pass

    def before_fit(self):
        self._remove()  # a monitor left on by remove_end=False
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
            self.model, modules=[n for n in self._names if n is not None], steps="manual", every=self.every or 1,
            outputs=self.is_forward, grads=not self.is_forward, separate_calls=True, history=True,
            log_every=self.log_every, sinks=[_BatchSink(self)], eval=False,
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


class StoredHooks:
    """fastai's cb.hooks as users read it: `stored` (one entry per hooked module), len, indexing, iteration."""

    def __init__(self, cb):
        self.cb = cb

    @property
    def stored(self):
        return self.cb.last_stored()

    def __len__(self):
        return len(self.cb.modules or ())

    def __getitem__(self, i):
        return StoredHook(self.cb, i)

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def remove(self):
        self.cb._remove()


class StoredHook:
    """One module's entry of StoredHooks, as fastai's Hook: `stored`."""

    def __init__(self, cb, i):
        self.cb, self.i = cb, i

    @property
    def stored(self):
        return self.cb.last_stored()[self.i]


def call_index(record):
    """The call of a separate_calls record ("lin:output@1" -> 1; 0 for a target of every call)."""
    _, at, call = record["target"].rpartition("@")
    return int(call) if at else 0


class _BatchSink:
    """Receives hookstats' per-step records and appends fastai-shaped entries to the callback's stats. Each call
    of a module has its own records (separate_calls): fastai's hook overwrites what it stored at each call, so
    the entry is the last forward call's, or for gradients the first call's (backward reaches it last)."""

    def __init__(self, cb):
        self.cb = cb

    def write(self, step, records):
        kind = Kind.OUTPUT if self.cb.is_forward else Kind.GRAD_OUTPUT
        pick = max if self.cb.is_forward else min
        by_call = {}
        for r in records:
            if r["kind"] == kind:
                by_call.setdefault(r["module"], {}).setdefault(call_index(r), []).append(r)
        kept = {m: calls[pick(calls)] for m, calls in by_call.items()}
        self.cb._batches.append(L(self.cb.entry(kept.get(n)) for n in self.cb._names))

    def close(self):
        pass
