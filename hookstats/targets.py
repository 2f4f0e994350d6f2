"""The target vocabulary: what a target measures (Kind, spelled here and nowhere else) and which state it is
(TargetKey: module, kind, leaf, call)."""
import dataclasses

from .plain_enum import PlainStrEnum


class Kind(PlainStrEnum):
    """What a target measures. A str that prints, formats, hashes and reprs as its plain value, so ids
    ("fc1:output"), records, stats(kind="output") and saved files read as plain strings did, and a key made
    with "output" finds the state of Kind.OUTPUT."""
    OUTPUT = "output"
    GRAD_OUTPUT = "grad_output"
    INPUT = "input"
    GRAD_INPUT = "grad_input"
    PARAM_GRAD = "param_grad"
    PARAM = "param"
    WATCH = "watch"
    WATCH_GRAD = "watch_grad"


KINDS = tuple(k.value for k in Kind)
# When a step reaches each kind: forward ones in this order within a module, those read at the optimizer step last,
# the others (gradients, parameter values) in backward order (alerts.step_order)
FORWARD_KINDS = (Kind.INPUT, Kind.OUTPUT, Kind.WATCH)
OPTIMIZER_KINDS = (Kind.PARAM_GRAD,)


@dataclasses.dataclass(frozen=True)
class TargetKey:
    """What one state measures: `module` (module, parameter or watched tensor name), `kind` (a Kind: output,
    grad_output, input, grad_input, param_grad, param, watch, watch_grad), `leaf` (the path of the tensor inside a
    tuple/dict output, "" for a plain tensor) and `call` (the call's index in the step with
    separate_calls=True, else None: every call of a module goes to one state)."""
    module: str
    kind: Kind
    leaf: str = ""
    call: int = None

    @property
    def id(self):
        return f"{self.module}:{self.kind}{self.leaf}" + ("" if self.call is None else f"@{self.call}")



def key_parts(key):
    """(module, kind, leaf, call) of a TargetKey, or of the plain tuple a hook inside torch.compile makes instead:
    Dynamo specializes the graph on every field of a dataclass or named tuple it constructs (the module's name, so
    each block compiled on its own would get its own graph), not on those of a plain tuple, whose name compiled
    code then reads only where a state is missing (StateStore.resolve)."""
    return key if type(key) is tuple else (key.module, key.kind, key.leaf, key.call)
