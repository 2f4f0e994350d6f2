"""Where hooks attach: module outputs and the gradients flowing back into them, module inputs (outputs.py),
gradients w.r.t. module inputs (input_grads.py), parameter gradients once per optimizer step (param_grads.py),
the parameters themselves after each optimizer step (params.py) and any tensor (watch.py). Each hook only
resolves a preallocated state and calls the fused op through its Port (state owner and step clock); none of
them changes what it observes."""

from ..state import Kind, Phase, TargetKey
from ..tensors import is_measurable
from .calls import CallIndex
from .handles import hook_module, optimizer_hooks
from .input_grads import InputGrads
from .outputs import input_hook, output_hook
from .param_grads import ParamGrads
from .params import ParamValues
from .port import Port

__all__ = ["Hooks", "Port"]


class Hooks:
    """Every hook of one monitor, registered in this order: parameter gradients and values (they check their
    parameters before any hook is registered, and listen to the step clock's optimizer hooks), the step clock's
    root-forward and optimizer hooks, then per module the
    call index's pre-hook (first), output/input hooks, input-gradient hooks and the call index's end (last).
    remove() takes them all off; safe to call twice."""

    def __init__(self, port, model, modules, inputs=False, outputs=True, grads=True, input_grads=False,
                 param_grads=False, params=False):
        clock, calls = port.clock, port.calls
        self.port, self.handles, self.param_grads, self.params, self.per_call = port, [], None, None, []
        named = [(f"{name}.{pn}", p) for name, m in modules.items() for pn, p in m.named_parameters(recurse=False)]
        if param_grads:
            self.param_grads = ParamGrads(port, named)
        if params:
            self.params = ParamValues(port, named)
        self.handles.append(hook_module(model, clock.on_root_forward, pre=True))
        self.handles.append(hook_module(model, clock.on_root_forward_end, always_call=True))
        self.handles += optimizer_hooks(clock.on_optimizer_pre_step, clock.on_optimizer_step)
        clock.forward_listeners.append(self.new_forward)
        for name, m in modules.items():
            if calls.separate:  # registered first: its pre-hook runs before the others
                calls.index[name] = CallIndex(clock, name)
                self.handles.append(hook_module(m, calls.index[name].pre_hook, pre=True))
            if outputs or grads:
                self.handles.append(hook_module(m, output_hook(port, name, outputs, grads)))
            if outputs:
                self.preallocate(name, Kind.OUTPUT, m)
            if grads and any(p.requires_grad for p in m.parameters(recurse=False)):
                self.preallocate(name, Kind.GRAD_OUTPUT, m, phases=(Phase.TRAIN,))
            if inputs:
                self.handles.append(hook_module(m, input_hook(port, name, m), pre=True, with_kwargs=True))
                self.preallocate(name, Kind.INPUT, m)
            if input_grads:
                per_call = InputGrads(port, name, m)
                self.per_call.append(per_call)
                self.handles.append(hook_module(m, per_call.pre_hook, pre=True))
                self.handles.append(hook_module(m, per_call.forward_hook, always_call=True))
            if calls.separate:  # registered last: its forward hook runs after the others
                self.handles.append(hook_module(m, calls.index[name].forward_hook, always_call=True))

    def preallocate(self, name, kind, m, phases=None):
        p = next(m.parameters(recurse=False), None)
        if is_measurable(p):
            clock, calls = self.port.clock, self.port.calls
            for phase in phases or (tuple(Phase) if clock.track_eval else (Phase.TRAIN,)):
                self.port.store.state(TargetKey(name, kind, "", 0 if calls.separate else None), p.device, phase)

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
