"""attach() and Monitor, the facade users hold: it wires the state owner (state.py), the step clock (clock.py),
the hooks (hooks/), the per-step history (history.py, delivery.py) and merging across ranks (distributed.py). The
host reads the device state only in stats(), flushes and reduce()."""
import inspect
import weakref

import torch
from torch import nn

from . import accumulate, rawstate
from .clock import StepClock
from .config import attach_config, check_arg
from .hooks import Hooks, Port
from .hooks.watch import watch
from .selection import select_modules
from .phases import TRAIN
from .state import KINDS, PHASES, Phase, StateStore
from .records import HISTOGRAM_FIELDS, stats_records
from .user_warning import WarnOnce, warn_user


class Monitor:
    """Hooks on a model and the running statistics of each target. Use attach() to make one.

    A step is one forward of the root model in training mode (steps="forward"), or, with steps="manual" or
    once mon.step() has been called, what the caller ends with mon.step(). Step k is measured when
    k % every == 0 (step 0 is measured); its train-phase histograms on clock.is_hist_step's steps.

    What history.py, distributed.py and planner.py use (besides the user's API): cfg, modules, every,
    forward_order, step_listeners, step_count, step_sampled, step_hist, states(), split_steps(), eager_point(). The parts
    are public too: mon.store (state.StateStore), mon.clock (clock.StepClock), mon.port (what the hooks use),
    mon.hooks (hooks.Hooks), mon.step_history (history.History, or None without a history).
    """

    def __init__(self, model, cfg, modules, every=1, eval=False, inputs=False, outputs=True, steps="forward",
                 grads=True, input_grads=False, param_grads=False, params=False, separate_calls=False):
        if not isinstance(model, nn.Module):
            raise ValueError(f"model must be an nn.Module, got {type(model).__name__}")
        self.model, self.cfg, self.modules, self.track_eval = model, cfg, modules, eval
        self.store = StateStore(cfg)
        self.clock = StepClock(model, every, eval, steps, on_modes=self.store.set_modes,
                               exclusive=self.store.exclusive, hist_every=cfg.hist_every)
        self.every, self.separate_calls, self.tell = self.clock.every, separate_calls, WarnOnce()
        self.port = Port(self.store, self.clock, self.tell, separate_calls)
        self.step_listeners = self.clock.step_listeners  # callables(clock, finished_step, sampled, counted_hists, evaluated)
        self.forward_order = self.port.calls.forward_order  # name -> rank of its first eager forward call
        self.clock.eager_listeners.append(self.port.settle)
        for dev in {t.device for t in (*model.parameters(), *model.buffers())} - {torch.device("meta")}:
            self.store.flags(dev)  # compiled code cannot allocate them
        self.store.flags(torch.device("cpu"))
        self.options = dict(eval=eval, inputs=inputs, outputs=outputs, grads=grads, input_grads=input_grads,
                            param_grads=param_grads, separate_calls=separate_calls, steps=steps)
        self.hooks = Hooks(self.port, model, modules, inputs=inputs, outputs=outputs, grads=grads,
                           input_grads=input_grads, param_grads=param_grads, params=params)
        self._param_grads, self._params = self.hooks.param_grads, self.hooks.params
        self._hist_steps = HistSteps()
        self.step_listeners.append(self._hist_steps.on_step_end)

    # ---- steps and phases (hookstats/clock.py) ----
    def step(self):
        """Ends the current step. Once called, root forwards no longer count steps."""
        self.clock.eager_point()
        if self._param_grads is not None:
            self._param_grads.flush()  # loops without a torch.optim optimizer
        if self._params is not None:
            self._params.flush()
        self.clock.step()

    # read-only views of the clock
    step_count = property(lambda self: self.clock.step_count, doc="The step being run now.")
    paused = property(lambda self: self.clock.paused, doc="Whether pause() is in effect.")
    sampled = property(lambda self: self.clock.measuring, doc="Whether the current step is being measured.")
    step_sampled = property(lambda self: self.clock.step_sampled,
                            doc="Whether the open step was sampled at any time so far (paused or in an eval "
                                "forward now or not).")
    step_hist = property(lambda self: self.clock.step_hist,
                         doc="Whether the open step has counted its train-phase histograms at any time so far.")

    def pause(self):
        self.clock.pause()

    def resume(self):
        self.clock.resume()

    def eager_point(self):
        """Outside compiled code: allocates what compiled code reached first, says once what it changed."""
        self.clock.eager_point()

    # ---- measuring (hookstats/state.py, hookstats/hooks/) ----
    def states(self, phase=None, reached_only=True):
        """[(TargetKey, device, TargetState)] of `phase` (default: every phase), in allocation order;
        reached_only leaves out preallocated states no hook has reached, as stats() does."""
        return self.store.states(phase, reached_only)

    def split_steps(self):
        """From now on train states keep the open step apart from the steps before it (History needs it)."""
        self.store.split_steps()

    def measure(self, key, t):
        """Feeds tensor t to the state of `key` (a TargetKey) in the current phase (skips non-float tensors)."""
        self.port.measure_in(key, t, self.clock.phase)

    def watch(self, name, tensor):
        """Call inside a forward: measures `tensor` ("name:watch") and, if it requires grad, its gradient
        ("name:watch_grad"). Returns the tensor unchanged, so `x = mon.watch("attn", x)` also works."""
        return watch(self.port, name, tensor)

    # ---- reading ----
    def stats(self, phase=TRAIN, kind=None):
        """{target id: record} of running totals since attach or reset(). The one place that reads the device."""
        check_arg("phase", phase, PHASES)
        if kind is not None:
            check_arg("kind", kind, KINDS)
        self.eager_point()
        if self._param_grads is not None:
            self._param_grads.tell_if_never_measured()
        if self._params is not None:
            self._params.tell_if_never_measured()
        if self.clock.steps_uncounted():
            self.tell("steps", "hookstats: under torch.compile root forwards are not counted as steps, and no "
                               "torch.optim optimizer has stepped: call mon.step() after each step (outside the "
                               "compiled function) for every=N and history.")
        chosen = [st for key, _, st in self.states(phase) if kind is None or key.kind == kind]
        if not chosen and phase == Phase.TRAIN and kind is None:
            warn_user("hookstats: stats() is {}: no step was measured yet (run a training forward through the "
                      "model, in model.train() mode, first)")
        with self.store.exclusive():  # not halfway through another thread's step end (open step read twice)
            host = self.store.to_host(chosen)
        grouped = {}
        for st in chosen:
            grouped.setdefault(st.key, []).append(host[id(st)])
        keyed = [(key, *(rawstate.combine_all(parts))) for key, parts in grouped.items()]
        records = stats_records(keyed, self.cfg, phase)
        covered = self._hist_steps.read(self.clock) if phase == Phase.TRAIN else None
        for rec in records.values():
            rec["hist_steps"] = covered
        return records

    def reset(self):
        """Restarts the running totals (stats(), reduce(), histogram(), running min/max). The per-step history
        is not reset: the open step's record keeps what it measured before, recorded steps stay as they are."""
        with self.store.exclusive():  # another thread's forward lands wholly before or after
            if self.step_history is not None:
                self.step_history.before_reset()
            self.store.reset()
            self._hist_steps.reset()

    def reduce(self, group=None):
        """Every target's state merged over the ranks of `group` (all ranks must call it), as a snapshot
        with .stats(); the local state is left as it is. See hookstats.distributed."""
        from . import distributed
        reduced = distributed.reduce(self, group)
        reduced.hist_steps = self._hist_steps.read(self.clock)  # every rank counts histograms on the same steps
        return reduced

    # ---- per-step history (the device ring: hookstats/history.py; to the sinks: hookstats/delivery.py) ----
    step_history = None  # the History of attach(history=.../sinks=...), or None

    def history(self):
        """Per-step statistics kept on the host: a pandas DataFrame (step, target, kind, stat, value), or a
        dict of plain lists without pandas; every finished step is in it (an eager step whose optimizer has
        stepped is ended here, rather than at the next train forward). Needs attach(..., history=True) or sinks=[...]."""
        if self.step_history is None:
            raise RuntimeError("this monitor keeps no history: attach(model, history=True) or sinks=[...]")
        self.clock.end_stepped_step()  # a step whose optimizer has stepped is finished: it is in the read
        return self.step_history.frame()

    def histogram(self, target, phase=TRAIN):
        """The running histograms of one target id: linear (when configured), log2 and the float buckets."""
        stats = self.stats(phase=phase)
        if target not in stats:
            raise KeyError(f"no target {target!r}; targets are {sorted(stats)[:10]}")
        return {k: stats[target][k] for k in HISTOGRAM_FIELDS}

    def memory(self):
        """Bytes held by the monitor: running state, history ring and host staging buffers."""
        return self.store.memory(self.step_history)

    def flush(self):
        """Sends the recorded steps to the sinks now (one packed device-to-host copy per device)."""
        if self.step_history is not None:
            self.step_history.flush()

    @property
    def history_sink(self):
        """The hookstats.sinks.MemorySink holding the steps mon.history() keeps, or None without a history."""
        return self.step_history.memory_sink if self.step_history is not None else None

    @property
    def alerts(self):
        return list(self.step_history.alerts) if self.step_history is not None else []

    # ---- checkpoints (hookstats/checkpoint.py) ----
    def state_dict(self):
        """The step clock and every target's running totals (device tensors), for torch.save beside the model and
        optimizer. Take it between steps (after the optimizer step; after mon.step() with manual steps): a step
        whose train forward ran is ended, and the history is flushed to the sinks."""
        from . import checkpoint
        return checkpoint.state_dict(self)

    def load_state_dict(self, state_dict):
        """Resumes from state_dict(): the next step is the checkpoint's, stats() goes on from its totals, the
        sinks append from there. The monitor must be attached with the same modules, configuration, every= and
        options (a ValueError names what differs); the states go to the model's device."""
        from . import checkpoint
        checkpoint.load_state_dict(self, state_dict)

    # ---- lifetime ----
    def remove(self):
        """Removes every hook; safe to call twice. The statistics stay readable."""
        if _attached_to.get(self.model) is not None and _attached_to[self.model]() is self:
            del _attached_to[self.model]
        self.hooks.remove()
        self.clock.attached = False
        if self.step_history is not None:
            self.step_history.close()  # records the open step, flushes and closes the sinks

    @property
    def attached(self):
        return self.clock.attached

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()
        return False

    def __repr__(self):
        return (f"Monitor({len(self.modules)} modules, {len(self.store)} states, step={self.step_count}, "
                f"every={self.every}, backend={accumulate.backend()!r})")


class HistSteps:
    """Which train steps the running histograms hold (stats()' hist_steps): {"count", "first", "last", "steps"} of
    the finished histogram steps since attach or reset(), and the open step if it is one and a train forward ran in
    it; None before any. "steps" lists them as a tuple of ranges (the ramp and the grid of clock.is_hist_step, split
    where a pause skipped one): a few ranges however long the run. The eval phase counts its histograms in every
    forward (its records say None)."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.count, self.ranges = 0, []

    def on_step_end(self, clock, step, sampled, hist, evaluated=False):
        if hist:
            self.count += 1
            self.ranges = extend_ranges(self.ranges, step)

    def read(self, clock):
        count, ranges = self.count, self.ranges
        if clock.step_hist and clock.step_trained:
            count, ranges = count + 1, extend_ranges(ranges, clock.step_count)
        if not count:
            return None
        return {"count": count, "first": ranges[0].start, "last": ranges[-1][-1], "steps": tuple(ranges)}


def extend_ranges(ranges, step):
    """ranges (a list of ranges, ascending) with `step` (above them all) added: the last range extended when step
    keeps its stride, else a new one. A new list; the ranges are not changed."""
    if ranges:
        last = ranges[-1]
        if len(last) == 1:
            return ranges[:-1] + [range(last.start, step + 1, step - last.start)]
        if step - last[-1] == last.step:
            return ranges[:-1] + [range(last.start, step + 1, last.step)]
    return ranges + [range(step, step + 1)]


_attached_to = weakref.WeakKeyDictionary()  # model -> weakref of its last attached monitor (for summary())


def attached_monitor(model):
    """The monitor last attached to `model` and not removed yet, or None."""
    ref = _attached_to.get(model)
    mon = ref() if ref is not None else None
    return mon if mon is not None and mon.attached else None


def attach(model, *, modules=None, types=None, exclude=None, include_paramless=False, every=1, eval=None,
           steps="forward", inputs=False, outputs=True, grads=True, input_grads=False, param_grads=False,
           params=False, separate_calls=False, history=False, log_every=10, keep=1000, sinks=None, alerts=True,
           rank_zero_only=True, start_step=0, config=None, **config_kwargs):
    """Hooks `model` and returns a Monitor (also a context manager that removes the hooks on exit).

    modules/types/exclude select what is hooked (default: every module with parameters of its own);
    every=N measures one step in N (hist_every=M: the train histograms on one of those in M, steps k with
    k % (N * M) == 0, and the ramp N * (1, 2, 4, ...) below N * M; moments, counts, min/max, near-zero and NaN/Inf
    on each); steps="forward" counts a step per root forward in training mode,
    steps="manual" lets mon.step() end each step (gradient accumulation); eval measures eval-mode forwards (validation
    passes), kept apart from train, in any step (every=N samples train steps only): by default when the monitor
    keeps a history or has sinks, eval=False leaves them out, eval=True measures them without;
    inputs=True measures module inputs; grads (default on) the gradients flowing back into the outputs;
    input_grads=True the gradients w.r.t. module inputs, through each call only (a call that modifies its
    input in place is left out, said once); param_grads=True each parameter's gradient once per
    optimizer step; params=True the parameters themselves ("fc1.weight:param") after each optimizer step
    (or at mon.step()), at the cadence of every/hist_every; separate_calls=True keeps each call of a module in a
    step apart ("fc:output@1").
    config (a StatsConfig) or its fields as keywords (nbins, lo, hi,
    eps, near_zero, linear_hist, log_hist, float_hist, hist_every) set what is measured: by default the range-free float
    buckets; the fixed-range linear histogram when linear_hist=True or any of nbins/lo/hi is given.
    history=True (or an int: the device ring's capacity in steps) keeps per-step statistics, drained
    every log_every steps to mon.history() (the last `keep` steps) and to `sinks` (every step); alerts (True,
    False or hookstats.AlertRules).
    A paddle.nn.Layer is measured through Paddle's hooks with the same keywords (hookstats.attach routes it:
    hookstats/entry.py, docs/howto/paddle.md); param_grads=True then takes optimizer=, the Paddle optimizer whose
    step() measures them.
    Under torch.distributed the sinks write on rank 0 only (each rank's own statistics; mon.reduce() merges
    ranks); rank_zero_only=False lets every rank write (rank r > 0 writes <stem>.rank<r><suffix>).
    start_step=N: the first step is step N (a resumed run; mon.load_state_dict() also sets it, with the totals).
    """
    if not isinstance(model, nn.Module):
        raise ValueError(f"attach: model must be an nn.Module (or a paddle.nn.Layer), got "
                         f"{type(model).__module__}.{type(model).__name__}")
    from .history import attach_history, history_options
    history = history_options(history, log_every, keep, sinks, alerts)  # History's keywords, or None
    eval = history is not None if eval is None else eval  # validation passes recorded wherever records go
    flags = dict(include_paramless=include_paramless, eval=eval, inputs=inputs, outputs=outputs, grads=grads,
                 input_grads=input_grads, param_grads=param_grads, params=params, separate_calls=separate_calls,
                 rank_zero_only=rank_zero_only)
    for name, v in flags.items():
        check_arg(name, v, bool)
    start_step = check_arg("start_step", start_step, int, lo=0)
    config = attach_config(config, config_kwargs, None if history is None else history["log_every"], every,
                           keywords=ATTACH_KEYWORDS)
    if history is not None and rank_zero_only:
        from .sinks.muted import rank_zero_sinks
        history["sinks"] = rank_zero_sinks(history["sinks"])
    selected = select_modules(model, modules, types, exclude, include_paramless)
    if attached_monitor(model) is not None:
        warn_user("hookstats: this model already has a monitor attached, and both would measure every step: call "
                  "remove() on the first (or attach in `with hookstats.attach(model) as mon:`) before attaching again",
                  AttachedTwiceWarning)
    mon = Monitor(model, config, selected, every=every, eval=eval, inputs=inputs, outputs=outputs, steps=steps,
                  grads=grads, input_grads=input_grads, param_grads=param_grads, params=params,
                  separate_calls=separate_calls)
    mon.clock.start_at(start_step)
    mon.step_history = attach_history(mon, history)
    _attached_to[model] = weakref.ref(mon)
    return mon


ATTACH_KEYWORDS = tuple(inspect.signature(attach).parameters)  # what a misspelled keyword is matched against


class AttachedTwiceWarning(UserWarning):
    """attach() on a model that has a monitor attached already."""
