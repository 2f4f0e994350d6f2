"""Monitor, the facade users hold: it wires the state owner (state.py), the step clock (clock.py), the hooks (hooks/,
through the framework's adapter), the per-step history (history.py, delivery.py) and merging across ranks
(distributed.py). The host reads the device state only in stats(), flushes and reduce(). Made by attach()
(attaching.py)."""
from . import accumulate, rawstate, registry
from .checks import check_arg
from .clock import StepClock
from .hist_steps import HistSteps
from .hooks import Hooks, Port
from .host import to_host
from .phases import PHASES, TRAIN, Phase
from .records import HISTOGRAM_FIELDS, stats_records
from .state import StateStore
from .structure import StructureCheck
from .targets import KINDS
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
        self.tell = WarnOnce()
        self.clock = StepClock(adapter.mode(), options.every, options.eval, options.steps,
                               on_modes=self.store.set_modes, exclusive=self.store.exclusive,
                               hist_every=cfg.hist_every, tell=self.tell)
        self.every, self.separate_calls = self.clock.every, options.separate_calls
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
        param_hooks = [(what, hook) for what, hook in (("param_grads", self._param_grads), ("params", self._params))
                       if hook is not None]
        log_every = options.history["log_every"] if options.history else 10
        self.structure = StructureCheck(adapter, options, modules, param_hooks, self.tell, log_every)
        self.step_listeners.append(self.structure.on_step_end)

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
        self.structure.check()
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
        self.step_history.record_open_pass()  # a validation pass since: it is in the read too
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
        (device_bytes). With the float buckets the history's device bytes include, per target, 32 KiB rows: the
        baseline and one per histogram step a logging window holds (at most 2); docs/performance.md#memory."""
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
        with manual steps); the history is sent to the sinks first. Under torch.distributed each rank saves its own
        (its totals are held under its rank's name)."""
        from . import checkpoint
        sd = checkpoint.state_dict(self)
        sd["hist_steps"] = self._hist_steps.saved()  # the train steps the saved histograms hold (stats()' hist_steps)
        return sd

    def load_state_dict(self, state_dict):
        """Resumes from state_dict(): the next step is the checkpoint's, stats() goes on from its totals, the
        sinks append from there. The monitor must be attached with the same modules, configuration, every= and
        options (a ValueError names what differs), and under torch.distributed the state dict must be this rank's,
        of a run of as many ranks; the states go to the model's device."""
        from . import checkpoint
        # a state dict saved before hist_steps were kept: its steps are unknown, and stats() names only later ones
        saved = state_dict.get("hist_steps", []) if isinstance(state_dict, dict) else []
        ranges = HistSteps.parsed(saved)
        checkpoint.load_state_dict(self, state_dict)
        self._hist_steps.load(ranges)

    # ---- lifetime ----
    def remove(self):
        """Takes every hook off the model; with a history, records the last step, sends what is left to the
        sinks and closes them. Safe to call twice; the statistics stay readable."""
        registry.forget(self.model, self)
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
