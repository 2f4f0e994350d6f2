"""Gradients w.r.t. module inputs (input_grads=True): each positional input tensor reaches the module as a plain
view of itself whose gradient is tapped, so what is measured is the gradient flowing back through that call only;
calls that modify such an input in place are left out, said once."""
import torch

from ..targets import Kind, TargetKey
from ..tensors import tensor_leaves
from .calls import CallStacks
from .grad_taps import tap_grad
from .outputs import positional_leaves, positional_names
from .port import recomputing


class InputGrads:
    """input_grads=True: gradients w.r.t. a module's positional inputs, through the module only.

    Not PyTorch's BackwardHook (what register_full_backward_hook sets up): it wraps the module's outputs in a
    custom Function's view, and any in-place op on them afterwards (ReLU(inplace=True) after a conv called in a
    forward, x.add_() after a Linear) raises in the user's forward. Here the outputs are untouched and each
    positional input tensor that requires grad is passed on as x.view_as(x), an ordinary view (no copy; in-place
    ops on it stay legal), whose node in the graph only this call's uses reach: the gradient tap on it (a tensor
    hook, as for outputs: grad_taps.tap_grad) gets the gradient through the module alone, what BackwardHook gives
    as grad_input. An in-place op on that view or its base reroutes the gradient around its node; one during the
    call (an in-place module, a forward that changes its input) is seen here from the version counter and the
    call is left out, said once; one after the call is grad_taps' ViewTaps check."""

    def __init__(self, port, name, module):
        self.port, self.name = port, name
        self.names = positional_names(module)
        self.table = port.store.table(name)
        self.open = CallStacks()  # [(key, view, version)] (or None) of each call whose forward is running

    def reset(self):
        self.open.clear()

    def pre_hook(self, module, args):
        port, clock, calls = self.port, self.port.clock, self.port.calls
        recompute = recomputing()
        phase = clock.hook_phase(recompute)
        skip = phase is None or not torch.is_grad_enabled()
        if not skip and calls.separate:
            skip = calls.skip_recomputed(self.name, recompute, port.tell)
        wrap = [] if skip else [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
        if not wrap:
            self.open.push(None)
            return None
        call, compiling = calls.call_of(self.name), torch.compiler.is_compiling()
        args, taps = list(args), []
        for i in wrap:
            view = args[i].view_as(args[i])
            leaf = next(positional_leaves([None] * i + [view], self.names, tensor_leaves))[0]
            if compiling:
                # tapped now: compiled code cannot see an in-place change anyway, and a key kept in self.open past
                # the graph would be rebuilt from its values, specializing the graph on the module's name
                tap_grad(port, (self.name, Kind.GRAD_INPUT, leaf, call), view, phase, self.table)  # key_parts' tuple
            else:
                taps.append((TargetKey(self.name, Kind.GRAD_INPUT, leaf, call), view, view._version))
            args[i] = view
        self.open.push((phase, taps) if taps else None)
        return tuple(args)

    def forward_hook(self, module, args, out):
        opened = self.open.pop()
        if opened is None:
            return None
        phase, taps = opened
        for key, view, version in taps:
            if view._version != version:
                self.port.tell(f"grad_input_in_place:{key.id}",
                               f"hookstats: {key.id} is not measured: the module modifies its input in place "
                               f"({type(module).__name__}), which reroutes the gradient around the point where it "
                               "is read. Use the op out of place to measure it.")
            else:
                tap_grad(self.port, key, view, phase, self.table)
        return None
