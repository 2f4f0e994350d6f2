"""Module outputs and inputs: a forward hook measures each floating leaf of a module's output (and taps the
gradient flowing back into it), a forward pre-hook each leaf of its positional and keyword inputs."""
import inspect

import torch

from ..clock import in_recompute
from ..state import Kind, TargetKey
from ..tensors import tensor_leaves
from .grad_taps import GradTap, tap_grad
from .port import recomputing


def output_hook(port, name, values=True, grads=True):
    """Forward hook: each floating leaf of the output, and (grads) the gradient flowing back into it.

    Everything a call can share with the next is resolved once and kept per (leaf, call, phase): the op's bound
    arguments of the output's state (eager code passes them to StateStore.update, which checks x's device and
    kind itself) and the GradTap of its gradient; torch.compiler.is_compiling() is asked once per call."""
    clock, calls, store = port.clock, port.calls, port.store
    separate, forward_order = calls.separate, calls.forward_order
    outputs = {}  # (leaf, call, phase) -> StateStore.bound() arguments of the output's state (eager)
    taps = {}  # (leaf, call, phase) -> GradTap of the gradient flowing back into that output

    def hook(module, args, out):
        compiling = torch.compiler.is_compiling()
        # a recomputed forward (checkpointing) was measured the first time; with use_reentrant=True
        # its gradients flow through the recomputed graph only, so they are tapped there
        recompute = not compiling and in_recompute()
        phase = clock.hook_phase(recompute, compiling)
        if phase is None or recompute and not grads:
            return None
        if separate and calls.skip_recomputed(name, recompute, port.tell):
            return None
        if name not in forward_order:
            calls.saw(name, compiling)
        call = calls.call_of(name) if separate else None
        for leaf, t in (("", out),) if isinstance(out, torch.Tensor) else tensor_leaves(out):
            where = (leaf, call, phase)
            if values and not recompute:
                bound = None if compiling else outputs.get(where)
                if bound is None or not store.update(t, bound):
                    bound = port.measure_in(TargetKey(name, Kind.OUTPUT, leaf, call), t, phase, keep=not compiling,
                                            compiling=compiling)
                    if bound is not None:
                        outputs[where] = bound
            if grads and compiling:  # compiled code keeps no Python objects between calls
                tap_grad(port, TargetKey(name, Kind.GRAD_OUTPUT, leaf, call), t, phase)
            elif grads:
                tap = taps.get(where)
                if tap is None:
                    tap = taps[where] = GradTap(port, TargetKey(name, Kind.GRAD_OUTPUT, leaf, call), phase)
                tap(t)
        return None
    return hook


def positional_names(module):
    """How positional inputs are named, from module.forward's signature, so that one input slot is one
    target whatever a call passes: when exactly one positional parameter has no default, it is named like
    a tensor ("gru:input") and the optional ones by their parameter name, as if passed by keyword
    ("gru:input['hx']"); otherwise every slot is "[i]" (attention's query, key and value). None: by slot."""
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    return [p.name for p in positional] if len(required) == 1 and positional[0] is required[0] else None


def positional_leaves(args, names):
    """(path, tensor) of every tensor inside the positional inputs (or their gradients), named as
    positional_names() says."""
    if names is None:
        yield from tensor_leaves(tuple(args))
        return
    for i, a in enumerate(args):
        yield from tensor_leaves(a, "" if i == 0 else f"[{names[i]!r}]" if i < len(names) else f"[{i}]")


def input_hook(port, name, module):
    """Forward pre-hook (with kwargs): each floating leaf of the positional inputs (positional_names
    names them) and of the keyword inputs ("['attention_mask']")."""
    names = positional_names(module)
    clock, calls = port.clock, port.calls

    def hook(module, args, kwargs):
        compiling = torch.compiler.is_compiling()
        phase = None if recomputing(compiling) else clock.hook_phase(compiling=compiling)
        if phase is None:
            return None
        calls.saw(name)
        call = calls.call_of(name)
        for leaf, t in (*positional_leaves(args, names), *tensor_leaves(kwargs)):
            port.measure_in(TargetKey(name, Kind.INPUT, leaf, call), t, phase, compiling=compiling)
        return None
    return hook
