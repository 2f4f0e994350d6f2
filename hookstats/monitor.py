"""attach() and Monitor: which modules are hooked, when a step is sampled, and where each target's
device-resident state lives. Hooks only call the fused op; the host reads state only in stats()."""
import contextlib
import dataclasses
import fnmatch
import threading
import warnings
import weakref

import torch
from torch import nn

from . import accumulate, targets
from .targets import is_measurable, measured, tensor_leaves, unread_reason  # noqa: F401 (tensor_leaves: hookstats.monitor API)
from .config import StatsConfig, check_arg
from .records import stats_records
from .stats import chan_merge_rows, merge_states, new_fstate_values
from .user_warning import warn_user

PHASES = ("train", "eval")
KINDS = ("output", "grad_output", "input", "grad_input", "param_grad", "watch", "watch_grad")


@dataclasses.dataclass(frozen=True)
class TargetKey:
    """What one state measures: `module` (module, parameter or watched tensor name), `kind` (output,
    grad_output, input, grad_input, param_grad, watch, watch_grad), `leaf` (the path of the tensor inside a
    tuple/dict output, "" for a plain tensor) and `call` (the call's index in the step with
    separate_calls=True, else None: every call of a module goes to one state)."""
    module: str
    kind: str
    leaf: str = ""
    call: int = None

    @property
    def id(self):
        return f"{self.module}:{self.kind}{self.leaf}" + ("" if self.call is None else f"@{self.call}")


class TargetState:
    """The running state of one target in one phase on one device. Allocated once, updated in place."""

    __slots__ = ("key", "phase", "fstate", "istate", "scratch", "reached", "closed_f")

    def __init__(self, key, phase, device, cfg):
        self.key, self.phase = key, phase
        self.reached = False  # preallocated states no hook ever reached are left out of stats()
        self.fstate = torch.tensor(new_fstate_values(), dtype=torch.float64, device=device)
        self.istate = torch.zeros(cfg.istate_size, dtype=torch.int64, device=device)
        self.scratch = torch.zeros(scratch_bytes(device), dtype=torch.uint8, device=device)
        for t in (self.fstate, self.istate, self.scratch):
            mark_static(t)
        # With a per-step history, the op's fstate holds the open step only and closed_f the steps before
        # it (merged in at each step end), so a step's moments never come from subtracting running totals.
        self.closed_f = None

    def split_steps(self):
        if self.closed_f is None:
            self.closed_f = self.fstate.clone()
            self.fstate.copy_(torch.tensor(new_fstate_values(), dtype=torch.float64))

    def total_fstate(self):
        """The running fstate since attach or reset(), on the device."""
        return self.fstate if self.closed_f is None else chan_merge_rows(self.closed_f, self.fstate)

    def reset(self):
        self.fstate.copy_(torch.tensor(new_fstate_values(), dtype=torch.float64))
        if self.closed_f is not None:
            self.closed_f.copy_(self.fstate)
        self.istate.zero_()


def scratch_bytes(device):
    """Per-state scratch of the CUDA kernel (ticket + one partial per block of its grid), as the kernel
    computes it (csrc/cuda/accumulate_cuda.cu); the CPU kernel and the reference path need none."""
    device = torch.device(device)
    if device.type != "cuda" or not accumulate.has_cuda_kernel():
        return 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.ops.hookstats.cuda_scratch_bytes(index)


def mark_static(t):
    """Fixed addresses let CUDA graphs (torch.compile mode="reduce-overhead") keep the state in place."""
    try:
        torch._dynamo.mark_static_address(t)
    except Exception:  # older torch: nothing to mark
        pass


def own_params(m):
    return next(m.parameters(recurse=False), None) is not None


def module_names(model):
    """name -> module as targets are named: named_modules(), except that the root model, named "" there, is
    named after its class ("GPT2Model:output"; "GPT2Model_root" if a submodule has that name)."""
    named = dict(model.named_modules())
    root = type(model).__name__
    root = root if root not in named else f"{root}_root"
    return {(n or root): m for n, m in named.items()}


def select_modules(model, modules=None, types=None, exclude=None, include_paramless=False):
    """name -> module (module_names). Default: every module with parameters of its own (fastai's rule).
    modules: names or glob patterns (the root model also matches ""); types: module classes; exclude: names
    or glob patterns."""
    named = module_names(model)
    root = next(iter(named))

    def matches(name, pat):
        return fnmatch.fnmatchcase(name, pat) or pat == "" and name == root
    for what, pats in (("modules", modules), ("exclude", exclude)):
        if pats is None:
            continue
        if isinstance(pats, str):
            raise ValueError(f"{what} must be a list of names or glob patterns, not a string: {pats!r}")
        for p in pats:
            if not any(matches(n, p) for n in named):
                raise ValueError(f"{what}: no module of the model matches {p!r}; "
                                 f"modules are e.g. {list(named)[:8]}")
    if types is not None:
        types = tuple(types) if isinstance(types, (list, tuple)) else (types,)
        if not all(isinstance(t, type) and issubclass(t, nn.Module) for t in types):
            raise ValueError(f"types must be nn.Module subclasses, got {types!r}")
    out = {}
    for name, m in named.items():
        if modules is not None:
            if not any(matches(name, p) for p in modules):
                continue
        elif types is None and not (include_paramless or own_params(m)):
            continue
        if types is not None and not isinstance(m, types):
            continue
        if exclude is not None and any(matches(name, p) for p in exclude):
            continue
        out[name] = m
    if not out:
        raise ValueError("no module selected: check modules=, types= and exclude=")
    return out


class Monitor:
    """Hooks on a model and the running statistics of each target. Use attach() to make one.

    A step is one forward of the root model in training mode (steps="forward"), or, with
    steps="manual" or once mon.step() has been called, what the caller ends with mon.step(). Step k is measured when k % every == 0 (step 0 is measured).

    The hooks' port, what hookstats/targets.py uses (per tensor: plain attributes and methods, no layer
    between): phase, measuring, sampling, root_running, gradless_calls, forward_order, view_taps, untapped;
    measures_phase(), saw(), call_of(), next_watch_call(), key(), resolve(), accumulate(), accumulate_many(),
    measure_in(), tell(), eager_point(). Internal to hookstats: not for users, they may change.
    """

    def __init__(self, model, cfg, modules, every=1, eval=False, inputs=False, outputs=True, steps="forward",
                 grads=True, input_grads=False, param_grads=False, separate_calls=False):
        if not isinstance(model, nn.Module):
            raise ValueError(f"model must be an nn.Module, got {type(model).__name__}")
        every = check_arg("every", every, int, lo=1)
        self.model, self.cfg, self.every, self.track_eval = model, cfg, every, eval
        self.modules = modules
        self.step_count = 0  # the step being run now
        check_arg("steps", steps, ("forward", "manual"))  # a root forward in training mode is a step; mon.step() ends one
        self._manual = steps == "manual"
        self._paused = False
        self.phase = "train"
        self.measuring = True  # this step is sampled and its phase is measured: the eager hooks' fast check
        self.sampling = True  # this step is sampled (not paused, step % every == 0): what the device flags hold
        self._states = {}  # (phase, TargetKey, device) -> TargetState
        self._flags = {}  # device -> 1-element bool tensor: the device-side copy of sampling
        self._handles = []
        self._attached = True  # a plain bool: compiled code (watch) can read it, not the list of handles
        self.step_listeners = []  # callables(monitor, finished_step, it_was_sampled), run when a step ends
        self._op_args = cfg.op_args()
        self.separate_calls = separate_calls
        self._calls = {}  # watch name -> its calls so far in this forward (separate_calls=True)
        self._late = set()  # (phase, *key fields, device) first reached inside compiled code, allocated at the next eager point
        self._compiled = False  # a hook ran inside torch.compile
        self._told = set()  # one-time warnings already given
        self.gradless_calls = set()  # names called without grad (reentrant checkpointing's forward), separate_calls
        self._split_steps = False  # train states keep the open step apart (History sets it)
        self.forward_order = {}  # module or watch name -> rank of its first eager forward call (alerts' order)
        self.untapped = False  # a gradient tap was left out of compiled code (targets.COMPILED_GRAD_TAPS)
        self.view_taps = targets.ViewTaps()  # gradient taps on view outputs, checked for in-place ops
        self._lock = threading.Lock()  # _exclusive()
        self._param_grads = None
        self._input_grads = []  # targets.InputGrads (input_grads=True)
        self.root_running = 0  # root forwards running now (separate_calls numbers calls per root forward)
        for dev in {t.device for t in (*model.parameters(), *model.buffers())} - {torch.device("meta")}:
            self._flag(dev)  # compiled code cannot allocate them
        self._flag(torch.device("cpu"))
        if param_grads:  # first: it checks its parameters before any hook is registered
            named = [(f"{name}.{pn}", p) for name, m in modules.items()
                     for pn, p in m.named_parameters(recurse=False)]
            self._param_grads = targets.ParamGrads(self, named)
        self._handles.append(targets.hook_module(model, self._on_root_forward, pre=True))
        self._handles.append(targets.hook_module(model, self._on_root_forward_end, always_call=True))
        self._handles.append(targets.global_optimizer_hook(self._on_optimizer_step, post=True))
        self._optimizer_steps = 0  # steps ended by optimizer steps (compiled models, steps="forward")
        self._optimizers = weakref.WeakKeyDictionary()  # optimizer -> it steps this model's parameters
        no_bw = targets.followed_in_place(model, modules) if input_grads else set()
        if no_bw:
            warnings.warn(f"hookstats: input_grads=True skips {sorted(no_bw)}: an in-place module follows each of "
                          "them or starts it, and PyTorch's full backward hooks forbid in-place ops on a module's input and output",
                          RuntimeWarning, stacklevel=3)
        self._call_index = {}  # module name -> targets.CallIndex (separate_calls)
        for name, m in modules.items():
            if separate_calls:  # registered first: its pre-hook runs before the others
                self._call_index[name] = targets.CallIndex(self, name)
                self._handles.append(targets.hook_module(m, self._call_index[name].pre_hook, pre=True))
            if outputs or grads:
                self._handles.append(targets.hook_module(m, targets.output_hook(self, name, outputs, grads)))
            if outputs:
                self._preallocate(name, "output", m)
            if grads and any(p.requires_grad for p in m.parameters(recurse=False)):
                self._preallocate(name, "grad_output", m, phases=PHASES[:1])
            if inputs:
                self._handles.append(targets.hook_module(m, targets.input_hook(self, name, m), pre=True, with_kwargs=True))
                self._preallocate(name, "input", m)
            if input_grads and name not in no_bw:
                per_call = targets.InputGrads(self, name, m)
                self._input_grads.append(per_call)
                self._handles.append(targets.hook_module(m, per_call.pre_hook, pre=True))
                self._handles.append(targets.hook_module(m, per_call.forward_hook, always_call=True))
            if separate_calls:  # registered last: its forward hook runs after the others
                self._handles.append(targets.hook_module(m, self._call_index[name].forward_hook, always_call=True))

    # ---- steps and phases ----
    def _on_root_forward(self, module, args):
        self.phase = "train" if module.training else "eval"
        compiling = torch.compiler.is_compiling()
        # Compiled code keeps no count of running root forwards: Dynamo guards on every int a hook reads, and
        # a count its replayed side effects leave behind recompiled the model at every step.
        nested = not compiling and self.root_running > 0  # the root model called inside its own forward
        if not compiling:
            self.root_running += 1
        if nested:
            return None
        self._calls.clear()
        self.gradless_calls.clear()
        for per_call in (*self._call_index.values(), *self._input_grads):
            per_call.reset()  # a forward that raised leaves its calls open
        if compiling:
            # Counting steps here would put a Python branch on the step into the compiled graph and
            # recompile every step: compiled models count optimizer steps instead, or mon.step() calls.
            self._compiled = True
            return None
        if targets.in_recompute():
            self._update_active()  # an eval forward may have run since this step's forward
            return None  # a checkpointed root recomputed in backward is not a new step
        self.eager_point()
        if not self._manual and module.training:
            if self._step_has_forward:
                self._end_step()
            self._step_has_forward, self._eager_stepped = True, False
        self._update_active()

    def _on_root_forward_end(self, module, args, out):
        if not torch.compiler.is_compiling():
            self.root_running = max(self.root_running - 1, 0)

    def step(self):
        """Ends the current step. Once called, root forwards no longer count steps."""
        self._manual = True
        self.eager_point()
        if self._param_grads is not None:
            self._param_grads.flush()  # loops without a torch.optim optimizer
        self._end_step()
        self._update_active()

    def _on_optimizer_step(self, optimizer, args, kwargs):
        """Under compile an optimizer step of this model ends the step (root forwards are not counted there).
        In eager code the next train forward ends it, so a second optimizer's parameter gradients stay in
        it; if that next forward is the first compiled one, the compile's start ends it (_compile_started).
        Any optimizer step is also an eager point of a compiled loop: the next compiled call measures what
        the last one reached first (tuple outputs, watch...), with no stats() or mon.step() call."""
        if not self._manual and self._attached and self._steps_this_model(optimizer):
            if self._compiled:
                self._optimizer_steps += 1
                self._step_has_forward = self._eager_stepped = False
                self._end_step()
                self._update_active()
            elif self._step_has_forward:
                self._eager_stepped = True
                targets.on_compile_start(self._compile_started)
        if not torch.compiler.is_compiling():
            self.eager_point()

    def _compile_started(self):
        """Dynamo starts compiling a frame, in eager Python before it runs: an eager step whose optimizer has
        stepped ends here, so it is not merged into the compiled step that follows (one eager step first)."""
        if self._eager_stepped and self._step_has_forward and not self._manual and self._attached:
            self._step_has_forward = self._eager_stepped = False
            self._end_step()
            self._update_active()

    def _steps_this_model(self, optimizer):
        """Whether `optimizer` holds a parameter of the model (another model's optimizer ends no step here).
        Decided at its first step, after any wrapping (FSDP2) has replaced the parameters, then kept."""
        known = self._optimizers.get(optimizer)
        if known is None:
            mine = {id(p) for p in self.model.parameters()}
            known = not mine or any(id(p) in mine for g in optimizer.param_groups for p in g["params"])
            self._optimizers[optimizer] = known
        return known

    # Whether the open step was sampled at any time in it (a pause or an eval forward since does not undo
    # what it measured): History records exactly these steps.
    _step_sampled = True
    _step_has_forward = False  # a train root forward ran in the open step (steps="forward", eager)
    _eager_stepped = False  # and an optimizer of the model has stepped since

    def _end_step(self):
        finished, sampled = self.step_count, self._step_sampled
        self.step_count += 1
        self._step_sampled = False  # the caller's _update_active() decides for the next step
        for f in self.step_listeners:
            f(self, finished, sampled)

    def _update_active(self):
        sampled = not self._paused and self.step_count % self.every == 0
        self._step_sampled = self._step_sampled or sampled
        self.measuring = sampled and self.measures_phase()
        if sampled != self.sampling:
            self.sampling = sampled
            for flag in self._flags.values():
                flag.fill_(sampled)

    def measures_phase(self):
        return self.phase == "train" or self.track_eval

    @property
    def paused(self):
        return self._paused

    def pause(self):
        self._paused = True
        self._update_active()

    def resume(self):
        self._paused = False
        self._update_active()

    @property
    def sampled(self):
        """Whether the current step is being measured."""
        return self.measuring

    @property
    def step_sampled(self):
        """Whether the open step was sampled at any time so far (paused or in an eval forward now or not)."""
        return self._step_sampled

    # ---- measuring ----
    def _flag(self, device):
        flag = self._flags.get(device)
        if flag is None:
            flag = self._flags[device] = torch.tensor([self.sampling], dtype=torch.bool, device=device)
            mark_static(flag)
        return flag

    def state(self, key, device, phase=None):
        phase = phase or self.phase
        k = (phase, key, device)
        st = self._states.get(k)
        if st is None:
            st = self._states[k] = TargetState(key, phase, device, self.cfg)
            if self._split_steps and phase == "train":
                st.split_steps()
        return st

    def states(self, phase=None, reached_only=True):
        """[(TargetKey, device, TargetState)] of `phase` (default: every phase; a state has its .phase), in
        allocation order; reached_only leaves out preallocated states no hook has reached, as stats() does."""
        return [(key, device, st) for (ph, key, device), st in self._states.items()
                if (phase is None or ph == phase) and (st.reached or not reached_only)]

    def split_steps(self):
        """From now on train states keep the open step apart from the steps before it (History needs it)."""
        self._split_steps = True
        for (phase, _, _), st in self._states.items():
            if phase == "train":
                st.split_steps()

    def _preallocate(self, name, kind, m, phases=None):
        p = next(m.parameters(recurse=False), None)
        if is_measurable(p):
            for phase in phases or (PHASES if self.track_eval else PHASES[:1]):
                self.state(self.key(name, kind, "", 0 if self.separate_calls else None), p.device, phase)

    def key(self, module, kind, leaf, call):
        return TargetKey(module, kind, leaf, call)

    def saw(self, name):
        """Records the order in which the forward first reaches each hooked module (eager code only)."""
        if name not in self.forward_order and not torch.compiler.is_compiling():
            self.forward_order[name] = len(self.forward_order)

    def call_of(self, name):
        """The index of the running call of module `name` in this forward, or None when calls share one state."""
        index = self._call_index.get(name) if self.separate_calls else None
        return None if index is None else index.current()

    def next_watch_call(self, name):
        """The index of this mon.watch(name, ...) call in the current forward, or None when calls share one state."""
        if not self.separate_calls:
            return None
        n = self._calls.get(name, 0)
        self._calls[name] = n + 1
        return n

    def resolve(self, key, device, phase, reach=True):
        """(state, flag) of key, or None inside compiled code when they do not exist yet: compiled code
        cannot allocate them, so they are allocated at the next eager point (one recompile, then measured).
        reach=False leaves marking the state as reached (listed by stats()) to the caller."""
        k = (phase, key, device)
        st = self._states.get(k)
        flag = self._flags.get(device)
        if st is None or flag is None:
            if torch.compiler.is_compiling():
                # plain values: Dynamo cannot rebuild a TargetKey made in compiled code outside the graph
                self._late.add((phase, key.module, key.kind, key.leaf, key.call, device))
                return None
            st = self.state(key, device, phase)
            flag = self._flag(device)
        if reach:
            st.reached = True
        return st, flag

    def _exclusive(self):
        """The op releases the GIL: two threads driving the model must not update one state at once. Compiled
        code is one graph at a time, and cannot trace a lock."""
        return contextlib.nullcontext() if torch.compiler.is_compiling() else self._lock

    def accumulate(self, t, st, flag):
        with self._exclusive():
            accumulate.accumulate_(t, st.fstate, st.istate, st.scratch, flag, *self._op_args)

    def accumulate_many(self, ts, sts, device):
        with self._exclusive():
            accumulate.accumulate_many_(ts, [s.fstate for s in sts], [s.istate for s in sts], [s.scratch for s in sts],
                                  self._flag(device), *self._op_args)

    def measure_in(self, key, t, phase):
        x = measured(t)
        if x is not None:
            target = self.resolve(key, x.device, phase)
            if target is not None:
                self.accumulate(x, *target)
        elif (why := unread_reason(t)) is not None:
            self.tell(f"unread:{key.id}", f"hookstats: {key.id} is {why}: it is not measured")

    def measure(self, key, t):
        """Feeds tensor t to the state of `key` in the current phase (skips non-float tensors)."""
        self.measure_in(key, t, self.phase)

    def watch(self, name, tensor):
        """Call inside a forward: measures `tensor` ("name:watch") and, if it requires grad, its gradient
        ("name:watch_grad"). Returns the tensor unchanged, so `x = mon.watch("attn", x)` also works."""
        return targets.watch(self, name, tensor)

    def eager_point(self):
        """Runs outside compiled code (root forward, step, optimizer step, stats): allocates what compiled
        code reached first, says once what torch.compile changes and which view outputs lost their gradient."""
        self.view_taps.settle(self)
        if self._late:
            late = sorted(((phase, TargetKey(*k), dev) for phase, *k, dev in self._late),
                          key=lambda t: (t[0], t[1].id, str(t[2])))
            self._late = set()
            for phase, key, device in late:
                self.state(key, device, phase)
                self._flag(device)
            ids = list(dict.fromkeys(k[1].id + ("" if k[0] == "train" else f" ({k[0]})") for k in late))
            self.tell(("late", *ids), f"hookstats: {len(ids)} target(s) ({', '.join(ids)}) were first reached "
                              "inside torch.compile, where their state cannot be allocated; they are allocated now "
                              "and measured from the next call on (one recompile). Run one eager step before "
                              "compiling to measure them from the start.")
        if self.untapped:
            self.tell("untapped", f"hookstats: torch {torch.__version__} cannot compile hooks on gradients that "
                                  "update hookstats' state (fixed in torch 2.13): inside torch.compile, gradients "
                                  "flowing into outputs and watched tensors are not measured (grad_output, "
                                  "watch_grad); forward values and parameter gradients are.")
        if self._compiled and self._input_grads:
            self.tell("input_grads", "hookstats: input_grads=True uses PyTorch's backward-hook nodes (those of full "
                                     "backward hooks), which torch.compile cannot trace (a graph break per hooked "
                                     "module); they still run eagerly.")

    def tell(self, what, msg):
        if what not in self._told:
            self._told.add(what)
            warn_user(msg)

    # ---- reading ----
    def stats(self, phase="train", kind=None):
        """{target id: record} of running totals since attach or reset(). The one place that reads the device."""
        check_arg("phase", phase, PHASES)
        if kind is not None:
            check_arg("kind", kind, KINDS)
        self.eager_point()
        if self._param_grads is not None:
            self._param_grads.tell_if_never_measured()
        if self._compiled and not self._manual and not self._optimizer_steps:
            self.tell("steps", "hookstats: under torch.compile root forwards are not counted as steps, and no "
                               "torch.optim optimizer has stepped: call mon.step() after each step (outside the "
                               "compiled function) for every=N and history.")
        chosen = [st for key, _, st in self.states(phase) if kind is None or key.kind == kind]
        host = self._to_host(chosen)
        grouped = {}
        for st in chosen:
            grouped.setdefault(st.key, []).append(host[id(st)])
        keyed = [(key, *(merge_states(parts) if len(parts) > 1 else parts[0])) for key, parts in grouped.items()]
        return stats_records(keyed, self.cfg, phase)

    @staticmethod
    def _to_host(states):
        """One packed device-to-host transfer per device."""
        by_dev = {}
        for st in states:
            by_dev.setdefault(st.fstate.device, []).append(st)
        host = {}
        for sts in by_dev.values():
            f = torch.cat([s.total_fstate() for s in sts]).cpu().numpy().reshape(len(sts), -1)
            i = torch.cat([s.istate for s in sts]).cpu().numpy().reshape(len(sts), -1)
            for k, s in enumerate(sts):
                host[id(s)] = (f[k], i[k])
        return host

    def reset(self):
        """Restarts the running totals (stats(), reduce(), histogram(), running min/max). The per-step history
        is not reset: the open step's record keeps what it measured before, recorded steps stay as they are."""
        if self._history is not None:
            self._history.before_reset()
        for st in self._states.values():
            st.reset()

    def reduce(self, group=None):
        """Every target's state merged over the ranks of `group` (all ranks must call it), as a snapshot
        with .stats(); the local state is left as it is. See hookstats.distributed."""
        from . import distributed
        return distributed.reduce(self, group)

    # ---- per-step history, sinks, alerts (the logic is in hookstats/history.py) ----
    _history = None

    def history(self):
        """Per-step statistics kept on the host: a pandas DataFrame (step, target, kind, stat, value), or a
        dict of plain lists without pandas. Needs attach(..., history=True) or sinks=[...]."""
        if self._history is None:
            raise RuntimeError("this monitor keeps no history: attach(model, history=True) or sinks=[...]")
        return self._history.frame()

    def histogram(self, target, phase="train"):
        """The running linear and log2 histograms of one target id."""
        from .history import histogram
        return histogram(self, target, phase)

    def memory(self):
        """Bytes held by the monitor: running state, history ring and host staging buffers."""
        from .history import memory
        return memory([st for _, _, st in self.states(reached_only=False)], self._flags.values(), self._history)

    def flush(self):
        """Sends the recorded steps to the sinks now (one packed device-to-host copy per device)."""
        if self._history is not None:
            self._history.flush()

    @property
    def history_sink(self):
        """The hookstats.sinks.MemorySink holding the steps mon.history() keeps, or None without a history."""
        return self._history.memory_sink if self._history is not None else None

    @property
    def alerts(self):
        return list(self._history.alerts) if self._history is not None else []

    # ---- lifetime ----
    def remove(self):
        """Removes every hook; safe to call twice. The statistics stay readable."""
        if _attached_to.get(self.model) is not None and _attached_to[self.model]() is self:
            del _attached_to[self.model]
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._attached = False
        if self._param_grads is not None:
            self._param_grads.tell_if_never_measured()
            self._param_grads.remove()
        if self._history is not None:
            self._history.close()  # records the open step, flushes and closes the sinks

    @property
    def attached(self):
        return self._attached

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()
        return False

    def __repr__(self):
        return (f"Monitor({len(self.modules)} modules, {len(self._states)} states, step={self.step_count}, "
                f"every={self.every}, backend={accumulate.backend()!r})")


_attached_to = weakref.WeakKeyDictionary()  # model -> weakref of its last attached monitor (for summary())


def attached_monitor(model):
    """The monitor last attached to `model` and not removed yet, or None."""
    ref = _attached_to.get(model)
    mon = ref() if ref is not None else None
    return mon if mon is not None and mon.attached else None


def attach(model, *, modules=None, types=None, exclude=None, include_paramless=False, every=1, eval=False,
           steps="forward", inputs=False, outputs=True, grads=True, input_grads=False, param_grads=False,
           separate_calls=False, history=False, log_every=10, keep=1000, sinks=None, alerts=True, rank_zero_only=True,
           config=None, **config_kwargs):
    """Hooks `model` and returns a Monitor (also a context manager that removes the hooks on exit).

    modules/types/exclude select what is hooked (default: every module with parameters of its own);
    every=N measures one step in N; steps="forward" counts a step per root forward in training mode,
    steps="manual" lets mon.step() end each step (gradient accumulation); eval=True also measures eval-mode forwards, kept apart from train;
    inputs=True measures module inputs; grads (default on) the gradients flowing back into the outputs;
    input_grads=True the gradients w.r.t. module inputs (full backward hook nodes; no in-place ops on the
    outputs, graph breaks under torch.compile); param_grads=True each parameter's gradient once per
    optimizer step; separate_calls=True keeps each call of a module in a step apart ("fc:output@1").
    config (a StatsConfig) or its fields as keywords (nbins, lo, hi,
    eps, near_zero, linear_hist, log_hist) set what is measured.
    history=True (or an int: the device ring's capacity in steps) keeps per-step statistics, drained
    every log_every steps to mon.history() (the last `keep` steps) and to `sinks` (every step); alerts (True,
    False or hookstats.AlertRules).
    Under torch.distributed the sinks write on rank 0 only (each rank's own statistics; mon.reduce() merges
    ranks); rank_zero_only=False lets every rank write (give each rank its own paths).
    """
    if not isinstance(model, nn.Module):
        raise ValueError(f"attach: model must be an nn.Module, got {type(model).__name__} {model!r:.80}")
    flags = dict(include_paramless=include_paramless, eval=eval, inputs=inputs, outputs=outputs, grads=grads,
                 input_grads=input_grads, param_grads=param_grads, separate_calls=separate_calls,
                 rank_zero_only=rank_zero_only)
    for name, v in flags.items():
        check_arg(name, v, bool)
    from .history import History, history_options
    history = history_options(history, log_every, keep, sinks, alerts)  # History's keywords, or None
    if config is not None and not isinstance(config, StatsConfig):
        raise ValueError(f"config must be a hookstats.StatsConfig (or pass its fields as keywords: "
                         f"attach(model, nbins=..., lo=...)), got {type(config).__name__}")
    if config is not None and config_kwargs:
        raise ValueError("pass either config= or its fields as keywords, not both")
    if config is None:
        unknown = set(config_kwargs) - {f.name for f in dataclasses.fields(StatsConfig)}
        if unknown:
            raise ValueError(f"unknown argument(s) to attach: {sorted(unknown)}")
        config = StatsConfig(**config_kwargs)
    if history is not None and rank_zero_only:
        from .distributed import rank_zero_sinks
        history["sinks"] = rank_zero_sinks(history["sinks"])
    selected = select_modules(model, modules, types, exclude, include_paramless)
    mon = Monitor(model, config, selected, every=every, eval=eval, inputs=inputs, outputs=outputs, steps=steps,
                  grads=grads, input_grads=input_grads, param_grads=param_grads, separate_calls=separate_calls)
    if history is not None:
        try:
            mon._history = History(mon, **history)
        except Exception:
            mon.remove()
            raise
    _attached_to[model] = weakref.ref(mon)
    return mon
