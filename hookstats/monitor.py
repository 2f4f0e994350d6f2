"""attach() and Monitor, the facade users hold: it wires the state owner (state.py), the step clock (clock.py),
the hooks (hooks/), the per-step history (history.py, delivery.py) and merging across ranks (distributed.py). The
host reads the device state only in stats(), flushes and reduce()."""
import inspect
import weakref

from . import accumulate, rawstate
from .frameworks import adapter_for
from .clock import StepClock
from .checks import check_arg
from .hooks import Hooks, Port
from .options import attach_options
from .host import to_host
from .phases import PHASES, TRAIN, Phase
from .state import StateStore
from .targets import KINDS
from .records import HISTOGRAM_FIELDS, stats_records
from .user_warning import WarnOnce, warn_user


class Monitor:
    """The hooks on one model and the statistics they gather. Made by :func:`hookstats.attach`, never directly.

    Train as usual while it is attached; read the statistics when you want them: ``mon.stats()`` (totals since
    attach or ``reset()``), ``mon.history()`` (per step, with ``history=True``), ``mon.histogram(target)``.
    Nothing is read from the device in between. ``remove()``, or leaving the ``with`` block, takes the hooks off;
    what was measured stays readable.

    Steps: by default each forward of the model in training mode starts a step. With gradient accumulation (or
    any loop where a step is more than one forward) call ``mon.step()`` at the end of each step instead; once
    called, forwards no longer count steps. With ``every=N`` step ``k`` is measured when ``k % N == 0``.
    """

    # history, distributed and the planner read cfg, modules, every, forward_order, step_listeners, step_count,
    # step_sampled, step_hist, states(), split_steps() and eager_point(): renaming one breaks them
    def __init__(self, model, adapter, modules, options):
        if not adapter.is_model(model):
            raise ValueError(f"model must be an {adapter.noun}, got {type(model).__name__}")
        cfg = options.config
        self.model, self.adapter, self.cfg, self.modules, self.track_eval = model, adapter, cfg, modules, options.eval
        self.store = StateStore(cfg)
        self.clock = StepClock(adapter.mode(), options.every, options.eval, options.steps,
                               on_modes=self.store.set_modes, exclusive=self.store.exclusive,
                               hist_every=cfg.hist_every)
        self.every, self.separate_calls, self.tell = self.clock.every, options.separate_calls, WarnOnce()
        self.port = Port(self.store, self.clock, self.tell, options.separate_calls)
        adapter.bind(self.port)
        self.step_listeners = self.clock.step_listeners  # callables(clock, finished_step, sampled, counted_hists, evaluated)
        self.forward_order = self.port.calls.forward_order  # name -> rank of its first eager forward call
        self.clock.eager_listeners.append(self.port.settle)
        for dev in adapter.flag_devices():
            self.store.flags(dev)  # compiled code cannot allocate them
        self.options = options.saved()
        self.hooks = Hooks(self.port, adapter, model, modules, options)
        self._param_grads, self._params = self.hooks.param_grads, self.hooks.params
        self._hist_steps = HistSteps()
        self.step_listeners.append(self._hist_steps.on_step_end)

    # ---- steps and phases (hookstats/clock.py) ----
    def step(self):
        """Ends the current step and starts the next one. Call it after each optimizer step when a step is more
        than one forward (gradient accumulation, ``steps="manual"``); once called, forwards no longer count
        steps."""
        self.clock.eager_point()
        if self._param_grads is not None:
            self._param_grads.flush()  # loops without a torch.optim optimizer
        if self._params is not None:
            self._params.flush()
        self.clock.step()

    # read-only views of the clock
    step_count = property(lambda self: self.clock.step_count, doc="The number of the step being run now (from 0).")
    paused = property(lambda self: self.clock.paused, doc="Whether pause() is in effect.")
    sampled = property(lambda self: self.clock.measuring, doc="Whether the current step is being measured.")
    step_sampled = property(lambda self: self.clock.step_sampled,
                            doc="Whether the current step has been measured so far (with every=N, one step in N "
                                "is).")
    step_hist = property(lambda self: self.clock.step_hist,
                         doc="Whether the current step has counted its histograms so far (one measured step in "
                             "hist_every does).")

    def pause(self):
        """Stops measuring until resume(): forwards and backwards run meanwhile are not measured."""
        self.clock.pause()

    def resume(self):
        """Measures again after pause()."""
        self.clock.resume()

    def eager_point(self):
        """Under torch.compile: call it outside the compiled function (stats() and step() do) so that targets
        first reached inside compiled code get their statistics; says once what changed."""
        self.clock.eager_point()

    # ---- measuring (hookstats/state.py, hookstats/hooks/) ----
    def states(self, phase=None, reached_only=True):
        """[(TargetKey, device, state)] of `phase` (default: every phase): the raw per-target states, for tools
        built on hookstats; stats() gives their statistics."""
        return self.store.states(phase, reached_only)

    def split_steps(self):
        """Keeps each step's measurements apart from the steps before it (a history needs it; attach does it)."""
        self.store.split_steps()

    def measure(self, key, t):
        """Measures tensor `t` as target `key` (a TargetKey) in the current phase; tensors that are not floating
        point are skipped. watch() is the simpler way to measure a tensor of your own."""
        self.adapter.measure(key, t, self.clock.phase)

    def watch(self, name, tensor):
        """Call inside a forward: measures `tensor` ("name:watch") and, if it requires grad, its gradient
        ("name:watch_grad"). Returns the tensor unchanged, so `x = mon.watch("attn", x)` also works."""
        return self.adapter.watch(name, tensor)

    # ---- reading ----
    def stats(self, phase=TRAIN, kind=None):
        """The statistics of every target since attach or reset(): ``{target id: record}``, where a record is a
        dict of mean, std, min, max, near-zero shares, NaN/Inf counts, quantiles and histograms (Concepts says
        how to read each). phase: "train" or "eval" (validation passes); kind: only targets of that kind
        ("output", "grad_output", ...). This is when the statistics are copied from the device."""
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
            host = to_host(chosen)
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
        """Starts the totals of stats(), reduce() and histogram() (running min/max included) again from zero.
        The per-step history is kept as it is."""
        with self.store.exclusive():  # another thread's forward lands wholly before or after
            if self.step_history is not None:
                self.step_history.before_reset()
            self.store.reset()
            self._hist_steps.reset()

    def reduce(self, group=None, mesh=None, tp="tp", sharded=(), replicated=()):
        """Under torch.distributed: every target's statistics merged over the ranks of `group` (default: all),
        returned as a snapshot whose .stats() reads like mon.stats(). Every rank must call it; this monitor's own
        totals are left as they are. A tensor-parallel model: ``mesh=world_mesh`` (the DeviceMesh over every rank)
        and `tp`, the name of its tensor-parallel dimension: targets sharded over it are merged, targets replicated
        over it counted once; every other dimension (data, FSDP, pipeline stages) is merged. A target's DTensor
        placement says which it is, else its states (the same on every tensor-parallel rank: replicated);
        `sharded` and `replicated`, glob patterns of target ids (``["*.up:output"]``), declare it instead."""
        from . import distributed
        self.adapter.check_reduce()
        reduced = distributed.reduce(self, group, mesh=mesh, tp=tp, sharded=sharded, replicated=replicated)
        reduced.hist_steps = self._hist_steps.read(self.clock)  # every rank counts histograms on the same steps
        return reduced

    # ---- per-step history (the device ring: hookstats/history.py; to the sinks: hookstats/delivery.py) ----
    step_history = None  # the History of attach(history=.../sinks=...), or None

    def history(self):
        """The statistics of each recorded step (the last `keep` of them), in long format: a pandas DataFrame
        with columns step, target, kind, stat and value, or a dict of those lists without pandas. Every
        finished step is in it, the current one too once its optimizer has stepped. Needs
        ``attach(..., history=True)`` or ``sinks=[...]``."""
        if self.step_history is None:
            raise RuntimeError("this monitor keeps no history: attach(model, history=True) or sinks=[...]")
        self.clock.end_stepped_step()  # a step whose optimizer has stepped is finished: it is in the read
        return self.step_history.frame()

    def histogram(self, target, phase=TRAIN):
        """The histograms of one target since attach or reset(): the log2 histogram, the float buckets, the
        linear one (when configured, with its edges and under/overflow) and NaN/Inf counts."""
        stats = self.stats(phase=phase)
        if target not in stats:
            raise KeyError(f"no target {target!r}; targets are {sorted(stats)[:10]}")
        return {k: stats[target][k] for k in HISTOGRAM_FIELDS}

    def memory(self):
        """The bytes the monitor holds, as a dict: its statistics on the device (state_bytes), the history's
        buffers on the device and the host, the steps mon.history() keeps, and their device total
        (device_bytes)."""
        return self.store.memory(self.step_history)

    def flush(self):
        """Sends the steps recorded so far to the sinks now, rather than at the next log_every step."""
        if self.step_history is not None:
            self.step_history.flush()

    @property
    def history_sink(self):
        """The hookstats.sinks.MemorySink holding the steps mon.history() keeps, or None without a history."""
        return self.step_history.memory_sink if self.step_history is not None else None

    @property
    def alerts(self):
        """Every alert raised so far (NaN/Inf, dead units, exploding or vanishing std), oldest first."""
        return list(self.step_history.alerts) if self.step_history is not None else []

    @property
    def flights(self):
        """With ``alerts=AlertRules(flight=K)``: one :class:`hookstats.Flight` per alert burst, oldest first, each
        holding the last K steps of every target up to the alert, the alert and the first target to show it."""
        return list(self.step_history.flights) if self.step_history is not None else []

    def grad_norms(self, clip_norm=None, group=None):
        """The gradient norm of each parameter (``param_grads=True``) and their global norm, per kept step, each
        parameter's share of it, and with `clip_norm` what ``clip_grad_norm_(max_norm=clip_norm)`` would scale
        (a :class:`hookstats.GradNorms`).

        Under torch.distributed the norms are this rank's own, which is the global norm where every rank holds
        whole gradients (DDP). Where the gradients are split over ranks (FSDP shards, tensor- or pipeline-parallel
        parts), ``group="all"`` (every rank) or a ProcessGroup sums each parameter's squared norm over the group's
        ranks, so totals, shares and clipping are the model's: one collective, at this call, never in a step.
        Every rank of the group must call it, and gets the same answer; pass the group whose ranks hold disjoint
        pieces of the gradients (with HSDP, the shard group), or replicated gradients are counted once per rank."""
        from .grad_norms import check_group, grad_norms, summed_over
        group = check_group(group)
        self.history()  # a monitor without a history says so; flushes
        norms = grad_norms(self.history_sink.items(), clip_norm)
        return norms if group is None else summed_over(norms, group)

    # ---- checkpoints (hookstats/checkpoint.py) ----
    def state_dict(self):
        """The monitor's step and every target's totals, to torch.save beside the model and the optimizer
        (load_state_dict() resumes from it). Take it between steps, after the optimizer step (after mon.step()
        with manual steps); the history is sent to the sinks first."""
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
        """Takes every hook off the model; with a history, records the last step, sends what is left to the
        sinks and closes them. Safe to call twice; the statistics stay readable."""
        if _attached_to.get(self.model) is not None and _attached_to[self.model]() is self:
            del _attached_to[self.model]
        self.hooks.remove()
        self.clock.attached = False
        if self.step_history is not None:
            self.step_history.close()  # records the open step, flushes and closes the sinks

    @property
    def attached(self):
        """Whether the hooks are still on the model (False after remove())."""
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
           clip_norm=None, rank_zero_only=True, start_step=0, optimizer=None, config=None, **config_kwargs):
    """Hooks `model` and returns a :class:`Monitor` that measures it while it trains.

    The monitor is also a context manager: ``with hookstats.attach(model) as mon:`` removes the hooks on exit.
    A ``paddle.nn.Layer`` is measured through Paddle's hooks with the same keywords (see the PaddlePaddle how-to).

    Parameters
    ----------
    model : torch.nn.Module or paddle.nn.Layer
        The model to watch.
    modules : list of str, optional
        Names or glob patterns (``"encoder.*"``) of the modules to hook; the root model is ``""``. Default: every
        module with parameters of its own.
    types : type or tuple of types, optional
        Hook only modules of these classes (``nn.Linear``, ``(nn.Conv2d, nn.Linear)``).
    exclude : list of str, optional
        Names or glob patterns of modules to leave out.
    include_paramless : bool, default False
        Also hook modules without parameters of their own (activations, pooling).
    every : int, default 1
        Measure one step in `every` (step ``k`` is measured when ``k % every == 0``).
    eval : bool, optional
        Measure forwards in eval mode (validation passes), kept apart from the train phase. Default: on when the
        monitor keeps a history or has sinks, off otherwise.
    steps : {"forward", "manual"}, default "forward"
        What one step is: one root forward in training mode, or (``"manual"``) whatever ends with
        ``mon.step()``, for gradient accumulation.
    inputs : bool, default False
        Measure each hooked module's inputs.
    outputs : bool, default True
        Measure each hooked module's outputs.
    grads : bool, default True
        Measure the gradients flowing back into the outputs.
    input_grads : bool, default False
        Measure the gradients with respect to module inputs (a call that modifies its input in place is left
        out, and said once).
    param_grads : bool, default False
        Measure each parameter's gradient, once per optimizer step.
    params : bool, default False
        Measure the parameters themselves (``"fc1.weight:param"``) after each optimizer step (or at
        ``mon.step()``).
    separate_calls : bool, default False
        Keep each call of a module within a step apart (``"fc:output@1"``) instead of pooling them.
    history : bool or int, default False
        Keep every measured step's statistics (``mon.history()``, the sinks). An int sets how many steps the
        device buffer holds (default `log_every`; a full buffer is sent early).
    log_every : int, default 10
        Steps between copies of the history to the host and the sinks.
    keep : int, default 1000
        Steps that ``mon.history()`` keeps on the host (the sinks get every step).
    sinks : list of sinks, optional
        Where the history goes: ``hookstats.sinks.CSVSink``, ``JSONLSink``, ``TensorBoardSink``, ``WandbSink``...
        Giving sinks keeps a history.
    alerts : bool or AlertRules, default True
        Warn when a target turns NaN/Inf, explodes or dies; an :class:`AlertRules` sets the thresholds, False
        turns the alerts off. ``AlertRules(flight=K)`` keeps the last K steps of every target before an alert
        (``mon.flights``, a ``flight_<step>.jsonl`` beside the file sinks).
    clip_norm : float, optional
        With `param_grads`, the ``max_norm`` of a ``clip_grad_norm_`` that the per-step gradient norms given to the
        sinks are told against (``mon.grad_norms(clip_norm)`` asks any max afterwards).
    rank_zero_only : bool, default True
        Under ``torch.distributed``, only rank 0 writes to the sinks (each rank keeps its own statistics;
        ``mon.reduce()`` merges them). False lets every rank write (rank ``r > 0`` to
        ``<stem>.rank<r><suffix>``).
    start_step : int, default 0
        The number of the first step: a resumed run goes on from its checkpoint's step
        (``mon.load_state_dict()`` sets it too).
    optimizer : paddle.optimizer.Optimizer, optional
        A Paddle model only: with `param_grads`, the optimizer whose ``step()`` measures the parameter gradients
        (Paddle has no global optimizer hook).
    config : StatsConfig, optional
        What each target measures; or give its fields as keywords instead.
    **config_kwargs
        :class:`StatsConfig` fields: ``hist_every`` (count the histograms on one measured step in `hist_every`;
        default: 10, or fewer so each `log_every` window holds one), ``linear_hist``, ``nbins``, ``lo``, ``hi``
        (a fixed-range linear histogram), ``eps`` and ``near_zero`` (what counts as near zero), ``log_hist``,
        ``float_hist``.

    Returns
    -------
    Monitor
        The monitor; read it with ``mon.stats()``, ``mon.history()``, ``mon.histogram()``.
    """
    keywords = {k: v for k, v in dict(locals()).items() if k != "model"}
    from .history import attach_history
    adapter = adapter_for(model)
    options = attach_options(adapter, ATTACH_KEYWORDS, **keywords)
    selected = adapter.select(options)
    adapter.check_model(selected)
    if attached_monitor(model) is not None:
        warn_user("hookstats: this model already has a monitor attached, and both would measure every step: call "
                  "remove() on the first (or attach in `with hookstats.attach(model) as mon:`) before attaching again",
                  AttachedTwiceWarning)
    mon = Monitor(model, adapter, selected, options)
    mon.clock.start_at(options.start_step)
    mon.step_history = attach_history(mon, options.history)
    _attached_to[model] = weakref.ref(mon)
    return mon


ATTACH_KEYWORDS = tuple(inspect.signature(attach).parameters)  # what a misspelled keyword is matched against


class AttachedTwiceWarning(UserWarning):
    """attach() on a model that has a monitor attached already."""
