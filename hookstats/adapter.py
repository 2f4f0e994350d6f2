"""The framework adapter: what attach(), the Monitor and its hooks ask of a deep-learning framework (which modules a
model has, how to hook them, a tensor's leaves, how a tensor reaches the fused op, the train/eval mode, the gradient
tap and the optimizer hook). One Adapter subclass per framework (torch_adapter.py, paddle/adapter.py); the rest of
the engine is shared. frameworks.adapter_for() picks one from the model's class."""
from .hooks.handles import hook_module


class Adapter:
    """The protocol, with the defaults a framework that needs nothing special keeps. One instance per monitor: the
    model at attach, the monitor's Port once bind() gives it (hooks/port.py)."""

    noun = "module"  # what the framework calls a module, in error messages
    # attach() keywords this framework refuses when given (a true value), and why: never silently ignored
    refused = {}
    # attach() keywords that are not this framework's: given, they are unknown keywords (a TypeError)
    foreign = ()
    hook = staticmethod(hook_module)  # hook(module, fn, pre=False, **kwargs): a forward (pre-)hook's handle

    def __init__(self, model):
        self.model, self.port = model, None

    def bind(self, port):
        """The monitor's Port (state owner, step clock, calls), before any hook is registered."""
        self.port = port

    # ---- the model ----
    def select(self, options):
        """{name: module} that attach() hooks (options.modules, types, exclude, include_paramless)."""
        raise NotImplementedError

    def check_options(self, options):
        """Refuses what the framework cannot do with attach()'s keywords (a dict, checked and with eval resolved;
        a ValueError), before the StatsConfig is made."""

    def check_model(self, selected):
        """Refuses a model, or a selected module, that the hooks cannot measure (a ValueError naming it)."""

    def mode(self):
        """What the step clock reads as the root model's mode: an object whose .training is True in training."""
        return self.model

    def flag_devices(self):
        """The torch devices whose sampling flags are allocated at attach (compiled code cannot)."""
        raise NotImplementedError

    def own_params(self, module):
        """(name, parameter) of the module's own parameters (not its submodules')."""
        raise NotImplementedError

    def submodules(self):
        """Every module of the model now, for the check that the model did not change after attach (structure.py);
        None where the framework has no such check."""
        return None

    def passive(self, module):
        """Whether a module added after attach adds nothing to measure (structure.py): one that only wraps another
        (activation checkpointing's wrapper) or holds parameters for another to use."""
        return False

    def measured_params(self, module):
        """(name, parameter) of what param_grads/params measure for `module` (structure.py)."""
        return self.own_params(module)

    def trainable(self, param):
        """Whether a gradient flows into the parameter."""
        raise NotImplementedError

    def state_device(self, module):
        """The torch device where the module's targets are preallocated, or None to allocate at the first call."""
        raise NotImplementedError

    # ---- hooks ----
    def root_hooks(self, clock):
        """(pre-hook, hook) on the root model: the step clock's root-forward start and end."""
        return clock.on_root_forward, clock.on_root_forward_end

    def parameter_hooks(self, named, options):
        """(parameter gradients, parameter values): the objects measuring param_grads and params (None when off);
        each has flush(), tell_if_never_measured() and remove()."""
        raise NotImplementedError

    def step_hooks(self, clock):
        """Handles of the hooks that tell the step clock about optimizer steps."""
        return []

    def input_grads(self, name, module):
        """input_grads=True: the per-call object (pre_hook, forward_hook, reset()) of one module."""
        raise NotImplementedError

    def recompute_test(self, name):
        """A callable () -> whether the running call of module `name` is a recompute of activation checkpointing, in
        backward; built once per hook, asked by eager code only (compiled code is never a recompute)."""
        return never

    def leaves(self, obj, path=""):
        """(path, tensor) of every tensor inside obj (tuples, lists, dicts, dataclasses)."""
        raise NotImplementedError

    def output_reader(self, name, values, grads):
        """read(out, call, phase, compiling, recompute) for module `name`'s forward hook: measures each floating leaf
        of the output now (values, unless recompute) and taps the gradient flowing back into it (grads); built once
        per hook (it may keep what a call can share). One call per module call: the hook path of a one-tensor
        output adds no other frame to the framework's own."""
        raise NotImplementedError

    def measure(self, key, t, phase, compiling=None, table=None):
        """Measures tensor t into key's state (a TargetKey) in `phase`; table: its module's StateStore.table()."""
        raise NotImplementedError

    def watch(self, name, t):
        """mon.watch(name, t): t now ("name:watch") and its gradient ("name:watch_grad"); returns t."""
        raise NotImplementedError

    # ---- around the monitor ----
    def rank_zero_sinks(self, sinks):
        """attach(rank_zero_only=True): the sinks, muted on every rank but 0."""
        raise NotImplementedError

    def check_reduce(self):
        """Refuses mon.reduce() where the framework's ranks are not torch.distributed's."""


def never():
    return False
