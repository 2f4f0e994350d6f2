"""A monitor's state through a checkpoint, as optimizers and LR schedulers keep theirs: Monitor.state_dict() holds
the step clock and every target's running totals (device tensors, torch.save-able), load_state_dict() puts
them into a monitor attached with the same targets and configuration, on the model's device."""
import dataclasses

import torch

from . import layout
from .state import Kind, TargetKey, order

FORMAT = 1


def state_dict(mon):
    """The monitor's step and running totals. A step whose train forward has run is ended first (as the next
    forward would end it), and the history is flushed, so the sinks hold every step up to the checkpoint."""
    mon.eager_point()
    mon.clock.end_forward_step()
    mon.flush()
    with mon.store.exclusive():
        order([st for _, _, st in mon.states()])
        states = [{"phase": st.phase, "module": key.module, "kind": str(key.kind), "leaf": key.leaf, "call": key.call,
                   "fstate": st.total_fstate().detach().clone(), "istate": st.istate.detach().clone()}
                  for key, _, st in mon.states()]
    return {"format": FORMAT, "step": mon.step_count, "manual": mon.clock.manual, **identity(mon), "states": states}


def identity(mon):
    """What a state dict must agree on with the monitor loading it."""
    return {"config": dataclasses.asdict(mon.cfg), "modules": list(mon.modules), "every": mon.every,
            "options": dict(mon.options)}


def load_state_dict(mon, sd):
    """Replaces the monitor's step and running totals by those of `sd` (from state_dict()): the next step
    measured is sd's step, and stats() goes on from the totals. A state dict of a monitor with other modules,
    configuration, every= or attach() options is a ValueError naming what differs."""
    if not isinstance(sd, dict) or sd.get("format") != FORMAT or "states" not in sd:
        raise ValueError("load_state_dict: not a hookstats Monitor state dict (from mon.state_dict())")
    mine = identity(mon)
    diff = [f"{k}: {_differ(sd.get(k), v)}" for k, v in mine.items() if sd.get(k) != v]
    if diff:
        raise ValueError("load_state_dict: the state dict is of a monitor attached differently; " + "; ".join(diff))
    step, manual = sd.get("step"), sd.get("manual")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0 or not isinstance(manual, bool):
        raise ValueError(f"load_state_dict: step must be an int >= 0 and manual a bool, got {step!r}, {manual!r}")
    device = _device(mon.model)
    loaded = [(_key(s), s["phase"], *_tensors(mon, s, device)) for s in sd["states"]]
    mon.eager_point()
    with mon.store.exclusive():
        mon.store.reset()
        for key, phase, f, i in loaded:
            mon.store.state(key, device, phase).load(f, i)
    mon.clock.start_at(step, manual)
    if mon.step_history is not None:
        mon.step_history.rebase()


def _differ(theirs, mine):
    if isinstance(theirs, dict) and isinstance(mine, dict):
        keys = sorted(k for k in set(theirs) | set(mine) if theirs.get(k) != mine.get(k))
        return ", ".join(f"{k}={theirs.get(k)!r} (this monitor: {mine.get(k)!r})" for k in keys)
    if isinstance(theirs, list) and isinstance(mine, list):
        gone, new = [m for m in theirs if m not in mine], [m for m in mine if m not in theirs]
        return f"only in the state dict {gone[:5]}, only in this monitor {new[:5]}"
    return f"{theirs!r} (this monitor: {mine!r})"


def _key(s):
    try:
        key = TargetKey(s["module"], Kind(s["kind"]), s["leaf"], s["call"])
        if s["phase"] not in ("train", "eval"):
            raise ValueError(f"phase {s['phase']!r}")
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"load_state_dict: a malformed target state ({type(e).__name__}: {e})") from None
    return key


def _tensors(mon, s, device):
    f, i = s.get("fstate"), s.get("istate")
    want = {"fstate": (torch.float64, layout.FSTATE_SIZE), "istate": (torch.int64, mon.cfg.istate_size)}
    for name, t in (("fstate", f), ("istate", i)):
        dtype, size = want[name]
        if not isinstance(t, torch.Tensor) or t.dtype != dtype or t.dim() != 1 or size is not None and len(t) != size:
            raise ValueError(f"load_state_dict: {s.get('module')!r} {name} must be a 1-d {dtype} tensor"
                             + (f" of {size}" if size else "") + f", got {t!r:.80}")
    return f.to(device), i.to(device)


def _device(model):
    """Where the loaded states go: the model's device (its first parameter or buffer; CPU without any)."""
    for t in (*model.parameters(), *model.buffers()):
        if t.device.type != "meta":
            return t.device
    return torch.device("cpu")
