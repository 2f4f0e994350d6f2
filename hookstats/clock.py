"""The one step clock of a monitor: which step runs, in which phase, whether it is sampled (every=N, pause), what
ends a step (a train root forward, an optimizer step under compile, mon.step()), and the eager points where
compiled code's leftovers are settled."""
import contextlib
import weakref

import torch

from . import layout
from .checks import check_arg, check_count
from .phases import Phase


def in_recompute():
    """True while a forward runs inside backward: activation checkpointing recomputing its segment."""
    return torch._C._current_graph_task_id() != -1


_compile_methods = weakref.WeakKeyDictionary()  # owner -> function: called at the next Dynamo compile


def on_compile_start(method):
    """Calls method() (a bound method, held weakly) when Dynamo next starts compiling a frame: eager Python,
    before the compiled code runs. torch._dynamo.reset() clears Dynamo's callbacks, so this re-registers."""
    handler = getattr(torch._dynamo, "callback_handler", None)
    if handler is None:  # torch without compile callbacks
        return
    _compile_methods[method.__self__] = method.__func__
    if _compile_started not in handler.start_callbacks:
        handler.register_start_callback(_compile_started)


def _compile_started(args=None):
    trigger = getattr(args, "callback_trigger", None)
    if trigger is not None and trigger.name != "DYNAMO":  # a lazily compiled backward runs inside a step
        return
    waiting = list(_compile_methods.items())
    _compile_methods.clear()
    for owner, func in waiting:
        func(owner)


def is_hist_step(step, every, hist_every):
    """Whether train step `step` counts the histograms: with n = step / every (the index of a sampled step), n = 0,
    n a multiple of hist_every (the grid: each history window of log_every steps, a multiple of every * hist_every,
    holds one), and the ramp before the grid's second step, n = 1, 2, 4, 8, ... below hist_every, so a run
    shorter than one window is not described by its initial weights and activations alone. Fixed to step 0 (a
    resumed run keeps the steps of an uninterrupted one); the device flag follows it, nothing recompiles."""
    if step % every:
        return False
    n = step // every
    return n % hist_every == 0 or (n < hist_every and n & (n - 1) == 0)


def optimizer_param_ids(optimizer):
    """The ids of the parameters a torch.optim optimizer steps (its param_groups now)."""
    return [id(p) for group in optimizer.param_groups for p in group["params"]]


class StepClock:
    """A step is one forward of the root model in training mode (steps="forward"), or, with steps="manual" or
    once step() has been called, what the caller ends with step(). Step k is sampled when k % every == 0
    (step 0 is) and the clock is not paused; a forward is measured when its step is sampled and its phase is
    measured (train, or eval with track_eval). Whether a sampled step is a histogram step: is_hist_step(), a fixed
    set of steps (step 0 is one), so a pause() over one skips it rather than shifting the next ones.

    Listeners: step_listeners(clock, finished_step, it_was_sampled, it_counted_histograms, a_validation_pass_ran)
    when a step ends (the pass: eval root forwards measured while that step was open),
    forward_listeners() at the start of each root forward (not nested; compiled too), eager_listeners() at each
    eager point; on_modes(flag_modes()) at each update (the device flags follow it). The one optimizer hook of a
    monitor is the clock's: before_optimizer(optimizer, param_ids) before any torch.optim optimizer steps, and
    after_optimizer(optimizer, param_ids) after it, before the clock ends a compiled step (param_ids: the
    parameters it steps, optimizer_param_ids)."""

    def __init__(self, model, every=1, track_eval=False, steps="forward", on_modes=None,
                 exclusive=contextlib.nullcontext, hist_every=1, tell=None):
        self.model, self.track_eval, self.tell = model, track_eval, tell
        self.every = check_count("every", every)
        self.hist_every = check_count("hist_every", hist_every)
        # a root forward in training mode is a step; step() ends one
        self.manual = check_arg("steps", steps, ("forward", "manual")) == "manual"
        self.step_count = 0  # the step being run now
        self.paused = False
        self.phase = Phase.TRAIN
        self.measuring = True  # this step is sampled and its phase is measured: the eager hooks' fast check
        self.sampling = True  # this step is sampled (not paused, step % every == 0): what the device flags hold
        self.hist = True  # and it counts the histograms (is_hist_step): the flags hold it too
        # Whether the open step was sampled at any time in it (a pause or an eval forward since does not undo
        # what it measured): History records exactly these steps; and whether it counted histograms then.
        self.step_sampled = self.step_hist = True
        self.step_eval = False  # an eval root forward was measured in the open step (eval=True): a validation pass
        self.step_trained = False  # a train root forward ran in the open step
        self.attached = True  # a plain bool: compiled code can read it
        self.compiled = False  # a hook ran inside torch.compile
        self.optimizer_steps = 0  # steps ended by optimizer steps (compiled models, steps="forward")
        self.root_running = 0  # root forwards running now (separate_calls numbers calls per root forward)
        self.step_listeners, self.forward_listeners, self.eager_listeners = [], [], []
        self.before_optimizer, self.after_optimizer = [], []
        self.on_modes = on_modes
        self.exclusive = exclusive  # held while the step listeners run: no state is updated meanwhile
        self._step_has_forward = False  # a train root forward ran in the open step (steps="forward", eager)
        self._eager_stepped = False  # and an optimizer of the model has stepped since
        self._in_closure_step = False  # inside opt.step(closure): its closure's forwards are one step
        self._optimizers = weakref.WeakKeyDictionary()  # optimizer -> it steps this model's parameters

    def on_root_forward(self, module, args):
        self.phase = Phase.TRAIN if module.training else Phase.EVAL
        compiling = torch.compiler.is_compiling()
        # Compiled code must not read `paused` (Dynamo would guard on it and recompile at each pause/resume): a
        # pass run wholly paused under compile still marks the step; its record then holds what was measured.
        if self.phase == Phase.EVAL and self.track_eval and (compiling or not self.paused):
            self.step_eval = True
        # Compiled code keeps no count of running root forwards: Dynamo guards on every int a hook reads, and
        # a count its replayed side effects leave behind recompiled the model at every step.
        nested = not compiling and self.root_running > 0  # the root model called inside its own forward
        if not compiling:
            self.root_running += 1
        if nested:
            return None
        for f in self.forward_listeners:
            f()
        if compiling:
            # Counting steps here would put a Python branch on the step into the compiled graph and
            # recompile every step: compiled models count optimizer steps instead, or step() calls.
            self.compiled = True
            self.step_trained = self.step_trained or module.training
            return None
        if in_recompute():
            self.update_active()  # an eval forward may have run since this step's forward
            return None  # a checkpointed root recomputed in backward is not a new step
        self.eager_point()
        if module.training and not torch.is_grad_enabled():
            self._gradless_train_forward(args)
        if not self.manual and module.training:
            if self._step_has_forward and not self._in_closure_step:
                self._end_step()
            self._step_has_forward, self._eager_stepped = True, False
        self.step_trained = self.step_trained or module.training  # after the step it may have ended
        self.update_active()

    def _gradless_train_forward(self, args):
        """A root forward in training mode without grad: generate() or a rollout left in train mode, said once. A
        root checkpointed whole (use_reentrant=True, its forward run without grad) takes inputs that require grad."""
        if self.tell is None or (self.paused and self.manual) or any(
                isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            return
        self.tell("gradless_train_forward", (
            "hookstats: the model ran a forward in training mode under torch.no_grad() or inference_mode "
            "(generate(), sampling or a rollout without model.eval()?): its values go to the train statistics"
            + ("" if self.manual else ", and each such forward counts as a train step")
            + ". Call model.eval() before it (eval=True measures it as a validation pass); a pass that needs train "
            "mode (update_bn) leaves the statistics alone under mon.pause() with steps='manual'."))

    def on_root_forward_end(self, module, args, out):
        if not torch.compiler.is_compiling():
            self.root_running = max(self.root_running - 1, 0)

    def step(self):
        """Ends the current step. Once called, root forwards no longer count steps."""
        self.manual = True
        self._end_step()
        self.update_active()

    def start_at(self, step, manual=None):
        """Makes `step` the open step, with nothing measured in it yet (a run resumed at `step`)."""
        self.step_count = step
        if manual is not None:
            self.manual = manual
        self.step_sampled = self.step_hist = False
        self._step_has_forward = self._eager_stepped = self._in_closure_step = False
        self.update_active()

    def end_forward_step(self):
        """Ends the open step if a train root forward has run in it (steps="forward", eager), as the next forward
        would: a checkpoint taken after a step's optimizer step holds that step."""
        if not self.manual and self._step_has_forward:
            self._step_has_forward = self._eager_stepped = False
            self._end_step()
            self.update_active()

    def on_optimizer_pre_step(self, optimizer, args, kwargs):
        """Before a torch.optim optimizer steps: an eager point, then before_optimizer (parameter gradients). Given a
        closure (LBFGS, Lightning), step() runs the backward itself: its gradients exist only after it steps."""
        if not has_closure(args, kwargs):
            self._in_closure_step = False  # a step(closure) that raised left it set
            if self.before_optimizer:
                self._before_optimizer(optimizer)
        elif not self.manual and self.attached and self._steps_this_model(optimizer):
            # LBFGS evaluates its closure several times: those forwards are this optimizer step's, one step
            self.end_forward_step()
            self._in_closure_step = True

    def _before_optimizer(self, optimizer):
        self.eager_point()
        ids = optimizer_param_ids(optimizer)
        for f in self.before_optimizer:
            f(optimizer, ids)

    def on_optimizer_step(self, optimizer, args, kwargs):
        """After a torch.optim optimizer step: after_optimizer (parameter values) in the step it belongs to, then
        under compile an optimizer step of this model ends the step (root forwards are not counted there).
        In eager code the next train forward ends it, so a second optimizer's parameter gradients stay in
        it; if that next forward is the first compiled one, the compile's start ends it (compile_started).
        Any optimizer step is also an eager point of a compiled loop: the next compiled call measures what
        the last one reached first (tuple outputs, watch...), with no stats() or step() call."""
        if has_closure(args, kwargs):
            self._in_closure_step = False
            if self.before_optimizer:  # the gradients the closure made and it stepped with
                self._before_optimizer(optimizer)
        if self.after_optimizer:
            ids = optimizer_param_ids(optimizer)
            for f in self.after_optimizer:
                f(optimizer, ids)
        if not self.manual and self.attached and self._steps_this_model(optimizer):
            if self.compiled:
                self.optimizer_steps += 1
                self._step_has_forward = self._eager_stepped = False
                self._end_step()
                self.update_active()
            elif self._step_has_forward:
                self._eager_stepped = True
                on_compile_start(self.compile_started)
        if not torch.compiler.is_compiling():
            self.eager_point()

    def compile_started(self):
        """Dynamo starts compiling a frame, in eager Python before it runs: an eager step whose optimizer has
        stepped ends here, so it is not merged into the compiled step that follows (one eager step first)."""
        self.end_stepped_step()

    def end_stepped_step(self):
        """Ends the open eager step if its optimizer has stepped since its train forward (the step is done: the
        next train forward would end it): at a compile start, and when the history is read, so a read has every
        finished step. The next train forward then starts the next step without ending one."""
        if self._eager_stepped and self._step_has_forward and not self.manual and self.attached:
            self._step_has_forward = self._eager_stepped = False
            self._end_step()
            self.update_active()

    def _steps_this_model(self, optimizer):
        """Whether `optimizer` holds a parameter of the model (another model's optimizer ends no step here).
        Decided at its first step, after any wrapping (FSDP2) has replaced the parameters, then kept."""
        known = self._optimizers.get(optimizer)
        if known is None:
            mine = {id(p) for p in self.model.parameters()}
            known = not mine or any(i in mine for i in optimizer_param_ids(optimizer))
            self._optimizers[optimizer] = known
        return known

    def _end_step(self):
        finished, sampled, hist, evaluated = self.step_count, self.step_sampled, self.step_hist, self.step_eval
        self.step_count += 1
        self.step_sampled = self.step_hist = False  # the caller's update_active() decides for the next step
        self.step_eval = self.step_trained = False
        with self.exclusive():
            for f in self.step_listeners:
                f(self, finished, sampled, hist, evaluated)

    def pass_recorded(self):
        """The open step's validation pass has been recorded (a read of the history): eval forwards from now on
        are a new part of it."""
        self.step_eval = False

    def update_active(self):
        sampled = not self.paused and self.step_count % self.every == 0
        hist = is_hist_step(self.step_count, self.every, self.hist_every)
        self.step_sampled = self.step_sampled or sampled
        self.step_hist = self.step_hist or (sampled and hist)
        self.sampling, self.hist = sampled, hist
        self.measuring = self.measures(self.phase)
        if self.on_modes is not None:  # the store refills its device flags only when their mode changed
            self.on_modes(self.flag_modes())

    def flag_modes(self):
        """What the op does now with a value of each phase (PHASES order): the device flags hold it, compiled code
        reads them. 0: nothing; 1: measure it; 1 | SKIP_HIST: measure it without the histograms (train steps
        that are no is_hist_step). The eval flag follows pause() alone; whether eval values reach the op at all
        is measures()' (eval=True)."""
        train = (1 if self.hist else 1 | layout.SKIP_HIST) if self.sampling else 0
        return train, 0 if self.paused else 1

    def measures_phase(self):
        return self.phase == Phase.TRAIN or self.track_eval

    def measures(self, phase):
        """Whether values of `phase` are measured now: train values on sampled steps (every=N, not paused), eval
        values (eval=True) whenever the clock is not paused, whatever step they fall in: a validation pass after
        an unsampled train step must not be lost whole. The device flags hold the same (flag_modes)."""
        return self.sampling if phase == Phase.TRAIN else self.track_eval and not self.paused

    def hook_phase(self, recompute=False, compiling=None):
        """The phase a hook running now measures into, or None when it measures nothing. Inside a root forward
        (and in compiled code, where the device flag masks unsampled steps) it is that forward's phase. Two eager
        calls are not inside the last root forward, and take the mode the root model is in now instead of that
        forward's: a checkpointed segment recomputed in backward (a validation forward between a train forward
        and its backward must not take that step's gradients) and a hooked module called outside any root
        forward (model.eval(); model.encoder(x) must not join the train step it falls in, nor model.train();
        model.encoder(x) after a validation forward be lost to the eval phase). compiling: what the hook's
        torch.compiler.is_compiling() said (asked here when None)."""
        if torch.compiler.is_compiling() if compiling is None else compiling:
            return self.phase if self.measures_phase() else None
        if not recompute and self.root_running > 0:
            return self.phase if self.measuring else None
        phase = Phase.TRAIN if self.model.training else Phase.EVAL
        if not self.measures(phase):
            return None
        if phase == Phase.EVAL:
            self.step_eval = True
        return phase

    def pause(self):
        self.paused = True
        self.update_active()

    def resume(self):
        self.paused = False
        self.update_active()

    def eager_point(self):
        """Runs outside compiled code (root forward, step, optimizer step, stats): the listeners allocate what
        compiled code reached first and say once what torch.compile changed."""
        for f in self.eager_listeners:
            f()

    def steps_uncounted(self):
        """Compiled code ran, and neither step() nor a torch.optim optimizer step has ended a step."""
        return self.compiled and not self.manual and not self.optimizer_steps


def has_closure(args, kwargs):
    """Whether optimizer.step(closure) was called with a closure (args: the step's, the optimizer first)."""
    return (args[1] if len(args) > 1 else kwargs.get("closure")) is not None
