"""Module outputs and inputs, for any framework (its Adapter reads the tensors): a forward hook measures each
floating leaf of a module's output (and taps the gradient flowing back into it), a forward pre-hook each leaf of
its positional and keyword inputs."""
import inspect

import torch

from ..targets import Kind, TargetKey


def output_hook(port, adapter, name, values=True, grads=True):
    """Forward hook: each floating leaf of the output, and (grads) the gradient flowing back into it, through the
    adapter's output reader (built once per hook); torch.compiler.is_compiling() is asked once per call."""
    clock, calls = port.clock, port.calls
    separate, forward_order = calls.separate, calls.forward_order
    recomputing = adapter.recompute_test(name)
    read = adapter.output_reader(name, values, grads)

    def hook(module, args, out):
        compiling = torch.compiler.is_compiling()  # the op is torch's: so is the compiler of any framework
        recompute = not compiling and recomputing()
        phase = clock.hook_phase(recompute, compiling)
        if phase is None or recompute and not grads:
            return None
        if separate and calls.skip_recomputed(name, recompute, port.tell):
            return None
        if not compiling and name not in forward_order:  # compiled code would guard on the dict's length
            calls.saw(name, compiling)
        read(out, calls.call_of(name) if separate else None, phase, compiling, recompute)
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


def positional_leaves(args, names, leaves):
    """(path, tensor) of every tensor inside the positional inputs (or their gradients), named as
    positional_names() says; leaves: the adapter's."""
    if names is None:
        yield from leaves(tuple(args))
        return
    for i, a in enumerate(args):
        yield from leaves(a, "" if i == 0 else f"[{names[i]!r}]" if i < len(names) else f"[{i}]")


def input_hook(port, adapter, name, module):
    """Forward pre-hook (with kwargs): each floating leaf of the positional inputs (positional_names
    names them) and of the keyword inputs ("['attention_mask']")."""
    names = positional_names(module)
    clock, calls = port.clock, port.calls
    recomputing, leaves, measure = adapter.recompute_test(name), adapter.leaves, adapter.measure
    table = port.store.table(name)

    def hook(module, args, kwargs):
        compiling = torch.compiler.is_compiling()  # the op is torch's: so is the compiler of any framework
        phase = None if not compiling and recomputing() else clock.hook_phase(compiling=compiling)
        if phase is None:
            return None
        calls.saw(name, compiling)
        call = calls.call_of(name)
        for leaf, t in (*positional_leaves(args, names, leaves), *leaves(kwargs)):
            key = (name, Kind.INPUT, leaf, call) if compiling else TargetKey(name, Kind.INPUT, leaf, call)  # key_parts
            measure(key, t, phase, compiling, table)
        return None
    return hook
