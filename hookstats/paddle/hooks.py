"""Where hookstats hooks a Paddle model: the step clock's root-layer hooks, then per selected layer a forward
post-hook (outputs, and the gradients flowing back into them through Tensor.register_hook), a forward pre-hook
(inputs) and, with separate_calls, the call index; parameter gradients at the optimizer's step (optimizer.py)."""
import paddle

from ..hooks.calls import CallIndex
from ..hooks.handles import hook_module
from ..hooks.outputs import positional_names
from ..state import Kind, Phase, TargetKey
from . import bridge
from .taps import Taps


class LayerHooks:
    """Every Paddle hook of one monitor; remove() takes them all off (safe to call twice). `mode` is the root
    layer's TrainingMode: what the clock reads for the phase of a root forward."""

    def __init__(self, port, layer, layers, mode, inputs=False, outputs=True, grads=True, param_grads=None):
        clock, calls = port.clock, port.calls
        self.port, self.taps, self.handles, self.param_grads = port, Taps(port), [], param_grads
        self.handles.append(hook_module(layer, lambda _, args: clock.on_root_forward(mode, args), pre=True))
        self.handles.append(hook_module(layer, clock.on_root_forward_end, always_call=True))
        self.gradless = set()  # layers run without grad in the running root forward (recompute's first pass)
        clock.forward_listeners.append(self.new_forward)
        for name, m in layers.items():
            if calls.separate:  # registered first: its pre-hook runs before the others
                calls.index[name] = CallIndex(clock, name)
                self.handles.append(hook_module(m, calls.index[name].pre_hook, pre=True))
            if outputs or grads:
                self.handles.append(hook_module(m, self.output_hook(name, outputs, grads)))
            if outputs:
                self.preallocate(name, Kind.OUTPUT, m)
            if grads and any(not p.stop_gradient for p in m.parameters(include_sublayers=False)):
                self.preallocate(name, Kind.GRAD_OUTPUT, m, phases=(Phase.TRAIN,))
            if inputs:
                self.handles.append(hook_module(m, self.input_hook(name, m), pre=True, with_kwargs=True))
                self.preallocate(name, Kind.INPUT, m)
            if calls.separate:  # registered last: its post-hook runs after the others
                self.handles.append(hook_module(m, calls.index[name].forward_hook, always_call=True))

    def output_hook(self, name, values, grads):
        port, taps, clock, calls = self.port, self.taps, self.port.clock, self.port.calls

        def hook(layer, args, out):
            recompute = self.recomputing(name)
            phase = clock.hook_phase()
            if phase is None or recompute and not grads:
                return None
            if calls.separate and calls.skip_recomputed(name, recompute, port.tell):
                return None
            calls.saw(name)
            call = calls.call_of(name)
            for leaf, t in bridge.paddle_leaves(out):
                if values and not recompute:
                    taps.measure(TargetKey(name, Kind.OUTPUT, leaf, call), t, phase)
                if grads:
                    taps.tap_grad(TargetKey(name, Kind.GRAD_OUTPUT, leaf, call), t, phase)
            return None
        return hook

    def input_hook(self, name, layer):
        names = positional_names(layer)
        taps, clock, calls = self.taps, self.port.clock, self.port.calls

        def hook(layer, args, kwargs):
            phase = None if self.recomputing(name) else clock.hook_phase()
            if phase is None:
                return None
            calls.saw(name)
            call = calls.call_of(name)
            for leaf, t in (*positional_leaves(args, names), *bridge.paddle_leaves(kwargs)):
                taps.measure(TargetKey(name, Kind.INPUT, leaf, call), t, phase)
            return None
        return hook

    def new_forward(self):
        self.port.calls.new_forward()
        self.gradless.clear()

    def recomputing(self, name):
        """Whether this call of layer `name` is Paddle's recompute (activation checkpointing) running the layer
        again in backward: its first pass ran inside the root forward without grad, and now it runs outside any
        root forward with grad. Its values were measured in the first pass; its gradients flow through this one."""
        grad, clock = paddle.is_grad_enabled(), self.port.clock
        if clock.root_running > 0:
            if not grad and clock.phase == Phase.TRAIN:
                self.gradless.add(name)
            return False
        return grad and name in self.gradless

    def preallocate(self, name, kind, m, phases=None):
        p = next((p for p in m.parameters(include_sublayers=False) if p.dtype in bridge.MEASURED_DTYPES), None)
        device = bridge.torch_device(p.place) if p is not None else None
        if device is not None:
            clock, calls = self.port.clock, self.port.calls
            for phase in phases or (tuple(Phase) if clock.track_eval else (Phase.TRAIN,)):
                self.port.store.state(TargetKey(name, kind, "", 0 if calls.separate else None), device, phase)

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles.clear()
        if self.param_grads is not None:
            self.param_grads.remove()


def positional_leaves(args, names):
    """(path, tensor) of every Paddle tensor in the positional inputs, named as the torch input hooks name
    them (hookstats.hooks.outputs.positional_names)."""
    if names is None:
        yield from bridge.paddle_leaves(tuple(args))
        return
    for i, a in enumerate(args):
        yield from bridge.paddle_leaves(a, "" if i == 0 else f"[{names[i]!r}]" if i < len(names) else f"[{i}]")
