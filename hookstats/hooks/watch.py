"""mon.watch(name, t): any tensor inside a forward, measured now ("name:watch") and through its gradient
("name:watch_grad")."""
import torch

from ..targets import Kind, TargetKey
from ..tensors import MEASURED_DTYPES, is_measurable, watch_unread_reason
from .grad_taps import tap_grad
from .port import recomputing


def watch(port, name, t):
    """mon.watch(name, t): measures t now and, if it requires grad, its gradient. Returns t unchanged."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"watch: name must be a non-empty string, got {name!r}")
    if not (isinstance(t, torch.Tensor) and t.dtype in MEASURED_DTYPES):
        raise ValueError(f"watch({name!r}, ...): expected a float32/float64/float16/bfloat16 tensor, got "
                         f"{t.dtype if isinstance(t, torch.Tensor) else type(t).__name__}")
    clock, calls = port.clock, port.calls
    compiling = torch.compiler.is_compiling()
    recompute = recomputing(compiling)
    phase = clock.hook_phase(recompute, compiling) if clock.attached else None
    if phase is None:
        return t
    if not is_measurable(t):  # a floating tensor whose values the op cannot read: said once, as Paddle's watch does
        if (why := watch_unread_reason(t)) is not None:
            port.tell(f"unread:{name}:watch", f"hookstats: {name}:watch is not measured: its tensor is {why}")
        return t
    if calls.separate and calls.skip_recomputed(name, recompute, port.tell):
        return t
    calls.saw(name)
    call = calls.next_watch_call(name)
    if not recompute:
        port.measure_in(TargetKey(name, Kind.WATCH, "", call), t, phase, compiling=compiling)
    tap_grad(port, TargetKey(name, Kind.WATCH_GRAD, "", call), t, phase)
    return t
