"""Where hooks attach: module outputs and the gradients flowing back into them, module inputs (outputs.py),
gradients w.r.t. module inputs (input_grads.py), parameter gradients once per optimizer step (param_grads.py),
the parameters themselves after each optimizer step (params.py) and any tensor (watch.py). Each hook only
resolves a preallocated state and calls the fused op through its Port (state owner and step clock); none of
them changes what it observes. What differs between frameworks is asked of the monitor's Adapter (adapter.py)."""

from ..phases import Phase
from ..targets import Kind, TargetKey
from .calls import CallIndex
from .outputs import input_hook, output_hook
from .port import Port

__all__ = ["Hooks", "Port"]


class Hooks:
    """Every hook of one monitor, registered in this order: parameter gradients and values (they check their
    parameters before any hook is registered, and listen to the step clock's optimizer hooks), the step clock's
    root-forward and optimizer hooks, then per module the
    call index's pre-hook (first), output/input hooks, input-gradient hooks and the call index's end (last).
    remove() takes them all off; safe to call twice. options: the monitor's AttachOptions."""

    def __init__(self, port, adapter, model, modules, options):
        clock, calls, hook = port.clock, port.calls, adapter.hook
        self.port, self.adapter, self.handles, self.per_call = port, adapter, [], []
        named = [(f"{name}.{pn}", p) for name, m in modules.items() for pn, p in adapter.own_params(m)]
        self.param_grads, self.params = adapter.parameter_hooks(named, options)
        pre, post = adapter.root_hooks(clock)
        self.handles.append(hook(model, pre, pre=True))
        self.handles.append(hook(model, post, always_call=True))
        self.handles += adapter.step_hooks(clock)
        clock.forward_listeners.append(self.new_forward)
        for name, m in modules.items():
            if calls.separate:  # registered first: its pre-hook runs before the others
                calls.index[name] = CallIndex(clock, name)
                self.handles.append(hook(m, calls.index[name].pre_hook, pre=True))
            if options.outputs or options.grads:
                self.handles.append(hook(m, output_hook(port, adapter, name, options.outputs, options.grads)))
            if options.outputs:
                self.preallocate(name, Kind.OUTPUT, m)
            if options.grads and any(adapter.trainable(p) for _, p in adapter.own_params(m)):
                self.preallocate(name, Kind.GRAD_OUTPUT, m, phases=(Phase.TRAIN,))
            if options.inputs:
                self.handles.append(hook(m, input_hook(port, adapter, name, m), pre=True, with_kwargs=True))
                self.preallocate(name, Kind.INPUT, m)
            if options.input_grads:
                per_call = adapter.input_grads(name, m)
                self.per_call.append(per_call)
                if any(adapter.trainable(p) for _, p in adapter.own_params(m)):  # its first input's, as grad_output's
                    self.preallocate(name, Kind.GRAD_INPUT, m, phases=(Phase.TRAIN,))
                self.handles.append(hook(m, per_call.pre_hook, pre=True))
                # not always_call: Dynamo guards on each always-called hook's id, so blocks compiled on their own would
                # each get a graph; a forward that raises leaves its call open until the next root forward (new_forward)
                self.handles.append(hook(m, per_call.forward_hook))
            if calls.separate:  # registered last: its forward hook runs after the others
                self.handles.append(hook(m, calls.index[name].forward_hook, always_call=True))

    def preallocate(self, name, kind, m, phases=None):
        device = self.adapter.state_device(m)
        if device is not None:
            clock, calls = self.port.clock, self.port.calls
            for phase in phases or (tuple(Phase) if clock.track_eval else (Phase.TRAIN,)):
                self.port.store.state(TargetKey(name, kind, "", 0 if calls.separate else None), device, phase)

    def new_forward(self):
        self.port.calls.new_forward()
        for per_call in self.per_call:
            per_call.reset()  # a forward that raised leaves its calls open

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles.clear()
        if self.param_grads is not None:
            self.param_grads.tell_if_never_measured()
            self.param_grads.remove()
        if self.params is not None:
            self.params.tell_if_never_measured()
            self.params.remove()
