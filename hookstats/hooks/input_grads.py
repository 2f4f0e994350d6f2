"""Gradients w.r.t. module inputs (input_grads=True), through PyTorch's own per-call BackwardHook, and which
modules cannot have them (an in-place op on their input or output)."""
import torch
from torch.utils._pytree import tree_flatten, tree_unflatten
from torch.utils.hooks import BackwardHook

from ..state import Kind, TargetKey
from ..tensors import tensor_leaves
from .calls import CallStacks
from .outputs import positional_leaves, positional_names
from .port import recomputing


class InputGrads:
    """input_grads=True: gradients w.r.t. a module's positional inputs, through the module only.

    Each call gets its own torch.utils.hooks.BackwardHook, the object register_full_backward_hook sets up
    per call (the same identity nodes on inputs and outputs, the same gradients, the same ban on in-place
    ops on them), which lets each call keep its index ("fc:grad_input@1"), wraps the tensors nested in
    the output too (an LSTM's (out, (h, c))), and sets nothing up where no input requires grad (PyTorch
    would fire its hook with Nones, with a warning each time)."""

    def __init__(self, port, name, module):
        self.port, self.name = port, name
        self.names = positional_names(module)
        self.open = CallStacks()  # BackwardHook (or None) of each call whose forward is running

    def reset(self):
        self.open.clear()

    def pre_hook(self, module, args):
        port, clock, calls = self.port, self.port.clock, self.port.calls
        recompute = recomputing()
        phase = clock.hook_phase(recompute)
        skip = phase is None
        if not skip and calls.separate:
            skip = calls.skip_recomputed(self.name, recompute, port.tell)
        if skip or not (torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)):
            self.open.push(None)
            return None
        bw = BackwardHook(module, [self._measure(calls.call_of(self.name), phase)], [])
        self.open.push(bw)
        return bw.setup_input_hook(args)

    def forward_hook(self, module, args, out):
        bw = self.open.pop()
        if bw is None:
            return None
        leaves, spec = tree_flatten(out)
        if not any(isinstance(t, torch.Tensor) and t.requires_grad for t in leaves):
            if any(t.requires_grad for _, t in tensor_leaves(out)):
                self.port.tell(f"grad_input_out:{self.name}",
                               f"hookstats: {self.name}: gradients w.r.t. its inputs are not measured: its output, a "
                               f"{type(out).__name__}, is not a container torch.utils._pytree can rebuild")
            return None  # no gradient will flow back through this call
        return tree_unflatten(list(bw.setup_output_hook(tuple(leaves))), spec)

    def _measure(self, call, phase):
        port, name = self.port, self.name

        def hook(module, grad_input, grad_output):
            if not port.clock.attached:
                return None
            for leaf, g in positional_leaves(grad_input, self.names):
                port.measure_in(TargetKey(name, Kind.GRAD_INPUT, leaf, call), g, phase)
            return None
        return hook


def starts_in_place(m):
    """True if m modifies its input in place first: an in-place module (ReLU(inplace=True)...), or an
    nn.Sequential whose first module (recursively) is one."""
    while isinstance(m, torch.nn.Sequential) and len(m) > 0:
        m = m[0]
    return getattr(m, "inplace", False) is True


def followed_in_place(model, modules):
    """Names of selected modules whose input or output an in-place op modifies, as far as nn.Sequential
    shows it: the module itself starts in place, or the next module of an nn.Sequential (found through the
    nesting both ways) does. A full backward hook on them would make that in-place op raise; in-place ops
    in a forward function cannot be seen here."""
    parents = {}
    for pname, p in model.named_modules():
        if isinstance(p, torch.nn.Sequential):
            kids = list(p.named_children())
            for i, (k, _) in enumerate(kids):
                parents[f"{pname}.{k}" if pname else k] = (pname, kids[i + 1][1] if i + 1 < len(kids) else None)
    out = {name for name, m in modules.items() if starts_in_place(m)}
    for name in modules:
        n = name
        while n in parents:
            parent, nxt = parents[n]
            if nxt is not None:
                if starts_in_place(nxt):
                    out.add(name)
                break
            n = parent  # the last module's output is the parent Sequential's output
    return out
