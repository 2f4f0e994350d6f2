"""A monitor's state through a checkpoint, as optimizers and LR schedulers keep theirs: Monitor.state_dict() holds
the step clock and every target's running totals (device tensors, torch.save-able), load_state_dict() puts
them into a monitor attached with the same targets and configuration, on the model's device. The state dict names
the state layout its istates are in (rawstate.LAYOUT): one of another layout is refused, saying which. Under
torch.distributed each rank's totals are its own: they are held under the rank's name, so that
torch.distributed.checkpoint, which keeps one copy of a key that every rank saves, keeps each rank's, and a rank
loads only its own."""
import dataclasses

import torch

from . import layout, ranks, rawstate
from .phases import CHOICES, PHASES, Phase
from .buffers import order
from .targets import KINDS, Kind, TargetKey

FORMAT = 1
INT64_MAX = 2 ** 63 - 1
MAX_CALL = 2 ** 31 - 1
NAME_MAX = 1_000_000  # characters of a module, parameter, watch or leaf name


def state_dict(mon):
    """The monitor's step and running totals. A step whose train forward has run is ended first (as the next
    forward would end it), and the history is flushed, so the sinks hold every step up to the checkpoint."""
    mon.eager_point()
    mon.clock.end_forward_step()
    mon.flush()
    with mon.store.exclusive():
        order([st for _, _, st in mon.states()])
        states = [{"phase": str(st.phase), "module": key.module, "kind": str(key.kind), "leaf": key.leaf,
                   "call": key.call, "fstate": st.total_fstate().detach().clone(), "istate": st.istate.detach().clone()}
                  for key, _, st in mon.states()]
    world = ranks.world_size()
    return {"format": FORMAT, "layout": rawstate.LAYOUT, "step": mon.step_count, "manual": mon.clock.manual,
            **identity(mon), "world_size": world, "states": states if world == 1 else {_rank_key(ranks.rank()): states}}


def _rank_key(rank):
    return f"rank{rank}"


def _own_states(sd):
    """The target states of `sd` that are this process's: the list itself, or with several ranks, the list held
    under this rank's name. A state dict of another number of ranks, or of another rank, is a ValueError: each
    rank's totals are its own, and loading another's would count its values twice in reduce() (a state dict
    without world_size, of an earlier version, is taken as it is)."""
    world, rank, held = ranks.world_size(), ranks.rank(), sd["states"]
    saved = sd.get("world_size", world if isinstance(held, (list, tuple)) else None)
    if isinstance(saved, bool) or not isinstance(saved, int) or saved < 1:
        raise ValueError(f"load_state_dict: field 'world_size' must be an int of at least 1, got {saved!r:.40}")
    if saved != world:
        raise ValueError(f"load_state_dict: the state dict holds the totals of a run of {saved} rank(s) and this "
                         f"run has {world}: each rank's totals are its own, so resume with {saved} rank(s), or attach "
                         "a fresh monitor (attach(start_step=N) keeps the step numbers)")
    if world == 1:
        if not isinstance(held, (list, tuple)):
            raise ValueError(f"load_state_dict: states must be a list, got {type(held).__name__}")
        return held
    if not isinstance(held, dict) or not isinstance(held.get(_rank_key(rank)), (list, tuple)):
        has = sorted(map(str, held)) if isinstance(held, dict) else f"a {type(held).__name__}"
        raise ValueError(f"load_state_dict: the state dict holds no totals of rank {rank} (it holds {str(has):.200}): "
                         "each rank saves its own mon.state_dict() and loads it (a file per rank with torch.save, or "
                         "torch.distributed.checkpoint)")
    return held[_rank_key(rank)]


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
    other = rawstate.other_layout(sd.get("layout"))
    if other is not None:
        raise ValueError(f"load_state_dict: {other}: load it with the hookstats version that saved it")
    mine = identity(mon)
    diff = [f"{k}: {_differ(sd.get(k), v)}" for k, v in mine.items() if sd.get(k) != v]
    if diff:
        raise ValueError("load_state_dict: the state dict is of a monitor attached differently; " + "; ".join(diff))
    step, manual = sd.get("step"), sd.get("manual")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= INT64_MAX:
        raise ValueError(f"load_state_dict: field 'step' must be an int in 0..2^63-1, got {step!r:.40}")
    if not isinstance(manual, bool):
        raise ValueError(f"load_state_dict: field 'manual' must be a bool, got {manual!r:.40}")
    states = _own_states(sd)
    device = _device(mon.model)
    loaded, seen, allowed = [], set(), _targets(mon)
    for k, s in enumerate(states):
        key = _key(s)
        where = f"load_state_dict: states[{k}] ({key.id:.200})"
        if (key, s["phase"]) in seen:
            raise ValueError(f"{where}: a second state of this target and phase {s['phase']!r}")
        seen.add((key, s["phase"]))
        why = allowed(key)
        if why:
            raise ValueError(f"{where}: {why}")
        f, i = _tensors(mon, s)
        why = rawstate.invalid(f.numpy(), i.numpy(), mon.cfg.nbins, mon.cfg.flags)
        if why:
            raise ValueError(f"{where}: {why}")
        loaded.append((key, Phase(s["phase"]), f.to(device), i.to(device)))
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
    """The TargetKey of a state entry, its fields' types and ranges checked; the first bad one is named."""
    if not isinstance(s, dict):
        raise ValueError(f"load_state_dict: a target state must be a dict, got {type(s).__name__}")
    for name in ("module", "kind", "leaf", "phase", "call"):
        if name not in s:
            raise ValueError(f"load_state_dict: a target state without field {name!r}")
        v = s[name]
        if name == "call":
            ok = v is None or isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_CALL
            want = f"None or an int in 0..{MAX_CALL}"
        elif name == "kind":
            ok, want = v in KINDS, "one of " + ", ".join(KINDS)
        elif name == "phase":
            ok, want = v in PHASES, CHOICES
        else:
            ok = isinstance(v, str) and len(v) <= NAME_MAX and (name != "leaf" or v[:1] in ("", "[", "."))
            want = f"a string of at most {NAME_MAX} characters" + (", empty or a path starting with [ or ."
                                                                   if name == "leaf" else "")
        if not ok:
            raise ValueError(f"load_state_dict: a target state's field {name!r} must be {want}, got {v!r:.80}")
    return TargetKey(s["module"], Kind(s["kind"]), s["leaf"], s["call"])


def _targets(mon):
    """allowed(key) -> None, or why this monitor has no such target: a kind it does not measure, a module it is
    not attached to, a parameter it does not hold, a call index without separate_calls."""
    opts, modules = mon.options, set(mon.modules)
    params = {name for name, _ in mon.model.named_parameters()}
    switch = {Kind.OUTPUT: opts["outputs"], Kind.GRAD_OUTPUT: opts["grads"], Kind.INPUT: opts["inputs"],
              Kind.GRAD_INPUT: opts["input_grads"], Kind.PARAM_GRAD: opts["param_grads"],
              Kind.PARAM: mon.hooks.params is not None, Kind.WATCH: True, Kind.WATCH_GRAD: True}

    def allowed(key):
        if not switch[key.kind]:
            return f"field 'kind': this monitor does not measure {key.kind}"
        if key.kind in (Kind.PARAM_GRAD, Kind.PARAM) and key.module not in params:
            return f"field 'module': {key.module!r:.80} is no parameter of the model"
        if key.kind not in (Kind.PARAM_GRAD, Kind.PARAM, Kind.WATCH, Kind.WATCH_GRAD) and key.module not in modules:
            return f"field 'module': {key.module!r:.80} is not a module this monitor is attached to"
        if key.call is not None and not opts["separate_calls"]:
            return "field 'call': a call index, but this monitor was attached without separate_calls"
        return None
    return allowed


def _tensors(mon, s):
    """The state's (fstate, istate) on the CPU, of the dtypes and sizes of this monitor's config."""
    f, i = s.get("fstate"), s.get("istate")
    want = {"fstate": (torch.float64, layout.FSTATE_SIZE), "istate": (torch.int64, mon.cfg.istate_size)}
    for name, t in (("fstate", f), ("istate", i)):
        dtype, size = want[name]
        if not isinstance(t, torch.Tensor) or t.dtype != dtype or t.dim() != 1 or size is not None and len(t) != size:
            raise ValueError(f"load_state_dict: {s.get('module')!r:.80} {name} must be a 1-d {dtype} tensor"
                             + (f" of {size}" if size else "") + f", got {t!r:.80}")
        if t.device.type == "meta" or type(t) is not torch.Tensor:
            raise ValueError(f"load_state_dict: {s.get('module')!r:.80} {name} holds no values (a "
                             f"{t.device.type} {type(t).__name__}): load the checkpoint with map_location='cpu'")
    return f.detach().cpu(), i.detach().cpu()


def _device(model):
    """Where the loaded states go: the model's device (its first parameter or buffer; CPU without any)."""
    for t in (*model.parameters(), *model.buffers()):
        if t.device.type != "meta":
            return t.device
    return torch.device("cpu")
