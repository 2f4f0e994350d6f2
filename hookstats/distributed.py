"""Merges a Monitor's running state across torch.distributed ranks: Monitor.reduce() calls reduce() here.

Per call: one all_gather of every fstate packed in one buffer (exact Chan merge in rank order, min/max; with two
sums of each istate beside it, which tell a parameter copied on every rank: hookstats.param_copies) and one
all_reduce SUM of every istate packed in one buffer. Ranks may hold different targets, so the row
layout is the union of their target names, agreed through all_gather_object on the first call over a group and
kept for that group; each rank adds a flag "my targets fit the layout" to the istate buffer, and only when some
rank's do not (a target first reached since) are the names exchanged again and the two collectives repeated. Reading
that flag is the one host read beyond the collectives. The monitor's own running state is left as it is.
"""
import weakref

import torch
import torch.distributed as dist

from . import param_copies, rawstate, replicas
from .phases import Phase, check_phase, phase_label
from .ranks import is_initialized, rank, world_size  # noqa: F401 (hookstats.distributed.rank() and the others)
from .records import stats_records
from .buffers import order
from .user_warning import warn_user

all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
# monitor -> {(group, world size): [(phase, TargetKey)]}, the layout agreed at its last reduce() over each group: kept
# per group, since only a group's own ranks take part in its reduce() (one layout for all would be dropped by the
# ranks of a subgroup alone, and they would then exchange names where the others do not: mismatched collectives)
_layouts = weakref.WeakKeyDictionary()


class Reduced:
    """The merged state of every target over the ranks of a group, a snapshot taken by Monitor.reduce().
    stats() reads it like Monitor.stats(); states() gives the (fstate, istate) device tensors."""

    def __init__(self, cfg, keys, fstates, istates, world):
        self.cfg, self.world_size = cfg, world
        self._keys = keys  # [(phase, TargetKey)], rows of fstates [K, 5] and istates [K, S]
        self._f, self._i = fstates, istates
        self.hist_steps = None  # the train steps the histograms hold (Monitor.reduce() sets it)
        self.replicated = None  # with reduce(mesh=...): the train target ids counted once, replicated over TP
        # with reduce(mesh=...): train target id -> what decided its placement over TP: "declared", "placement"
        # (a DTensor's) or "states" (compared over the TP ranks), hookstats.replicas' rules
        self.placement_source = None

    def states(self):
        return {k: (self._f[r], self._i[r]) for r, k in enumerate(self._keys)}

    def stats(self, phase=Phase.TRAIN, kind=None):
        """{target id: record} over all ranks: the same records as Monitor.stats()."""
        check_phase(phase)
        f, i = self._f.cpu().numpy(), self._i.cpu().numpy()
        keyed = [(key, f[r], i[r]) for r, (ph, key) in enumerate(self._keys)
                 if ph == phase and (kind is None or key.kind == kind)]
        records = stats_records(keyed, self.cfg, phase)
        for rec in records.values():
            rec["hist_steps"] = self.hist_steps if phase == Phase.TRAIN else None
        return records

    def __repr__(self):
        return f"Reduced({len(self._keys)} targets over {self.world_size} ranks)"


def _comm_device(group):
    """NCCL (alone or as the CUDA half of "cpu:gloo,cuda:nccl") takes tensors on this rank's GPU; every
    other backend here is gloo, which is given CPU tensors."""
    if "nccl" in str(dist.get_backend(group)) and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _local_rows(monitor, device):
    """(phase, TargetKey) -> (fstate, istate) on `device`, one row per target (devices of a rank merged).
    Preallocated states no hook ever reached are left out, as in Monitor.stats()."""
    rows = {}
    with monitor.store.exclusive():  # copies taken while no thread updates a state or ends a step
        order([st for _, _, st in monitor.states()])
        for key, _, st in sorted(monitor.states(), key=lambda s: (s[2].phase, s[0].id, str(s[1]))):
            phase = st.phase
            f, i = st.total_fstate().to(device, copy=True), st.istate.to(device, copy=True)
            prev = rows.get((phase, key))
            rows[(phase, key)] = (f, i) if prev is None else rawstate.combine(prev, (f, i))
    return rows


def _check_same_config(configs):
    if any(c != configs[0] for c in configs):
        ranks = [r for r, c in enumerate(configs) if c != configs[0]]
        raise ValueError(f"hookstats reduce: the StatsConfig differs between ranks (rank 0 has {configs[0]}, "
                         f"ranks {ranks} differ); every rank must attach with the same configuration")


def reduce(monitor, group=None, mesh=None, tp="tp", sharded=(), replicated=()):
    """Merges `monitor`'s state over the ranks of `group` (default: the whole world); every rank of the group
    must call it. Without an initialized process group it returns the local state as a world of one.
    mesh (a DeviceMesh over every rank, instead of group): a tensor-parallel model's monitor; every rank is
    merged, each target replicated over the mesh's dimension `tp` once (hookstats.replicas); sharded and
    replicated: glob patterns of the target ids declared so, over what their tensors or states say."""
    if mesh is not None and group is not None:
        raise ValueError("hookstats reduce: give group= or mesh=, not both (with mesh= every rank is merged)")
    sharded, replicated = replicas.patterns("sharded", sharded), replicas.patterns("replicated", replicated)
    if (sharded or replicated) and mesh is None:
        raise ValueError("hookstats reduce: sharded= and replicated= declare how targets lie over the "
                         "tensor-parallel dimension of a mesh: give mesh=world_mesh (and tp=) too")
    monitor.eager_point()  # allocates states first reached inside compiled code
    devices = {st.fstate.device for _, _, st in monitor.states(reached_only=False)} or {torch.device("cpu")}
    if not is_initialized():
        device = next(iter(devices)) if len(devices) == 1 else torch.device("cpu")
        local = _local_rows(monitor, device)
        keys = sorted(local, key=_order)
        f, i = _pack(monitor.cfg, local, keys, device)
        return Reduced(monitor.cfg, keys, f, i, 1)
    if dist.get_rank(group) < 0:
        raise ValueError("hookstats reduce: this process is not a member of the given group")
    tp_group = replicas.tp_group_of(mesh, tp) if mesh is not None else None
    device, world = _comm_device(group), dist.get_world_size(group)
    local = _local_rows(monitor, device)
    agreed = _layouts.setdefault(monitor, {})
    keys = agreed.get((group, world))
    for attempt in range(2):
        if keys is None:
            keys = agreed[(group, world)] = _agree_on_keys(monitor.cfg, local, group, world)
        fits = set(local) <= set(keys)
        f, i = _pack(monitor.cfg, local, keys, device)
        if tp_group is not None:
            codes, declare_error = replicas.declared([k.id for _, k in keys], sharded, replicated)
        if tp_group is not None and keys:
            placed = [replicas.seen(monitor.store.placement(k), tp) for _, k in keys]
            same, how = replicas.decide(f, i, tp_group, torch.tensor(placed), torch.tensor(codes or [0] * len(keys)))
            constant = replicas.constant(f)
            f, i = replicas.keep_one_copy(f, i, same, first=dist.get_rank(tp_group) == 0)
        if keys:  # the fstates, and what tells a parameter's copies on every rank (param_copies)
            pieces = [param_copies.piece(monitor.store, k, tp if mesh is not None else None) for _, k in keys]
            rows = param_copies.packed(f, i, torch.tensor(pieces))
        i = torch.cat([i.reshape(-1), torch.tensor([int(fits)], dtype=torch.int64, device=device)])
        dist.all_reduce(i, op=dist.ReduceOp.SUM, group=group)
        if keys:
            gathered = torch.empty(world * rows.numel(), dtype=rows.dtype, device=device)  # flat: gloo takes no stack
            all_gather_single(gathered, rows.reshape(-1), group=group)
        if int(i[-1]) == world or attempt:  # the host read: every rank's targets fit the agreed layout
            break
        keys = None  # a target first reached since the names were agreed: agree again, once
    i = i[:-1].view(len(keys), monitor.cfg.istate_size)
    if keys:
        cls = param_copies.classes(world, mesh, tp)
        f, copies = param_copies.merge(keys, gathered.view((world,) + rows.shape), cls, monitor.cfg.istate_size)
        i = i // copies[:, None]
    reduced = Reduced(monitor.cfg, keys, f, i, world)
    if tp_group is not None:
        if declare_error:  # raised by every rank alike, after the collectives every rank made
            raise ValueError(declare_error)
        _tp_placements(reduced, keys, *((same, how, constant) if keys else ([], [], [])),
                       warn=dist.get_world_size(tp_group) > 1)
    return reduced


def _tp_placements(reduced, keys, same, how, constant, warn):
    """Sets what reduce(mesh=...) decided per train target; names the targets counted once because their states
    were alike and constant (all zeros, for one), which equal shards would also be (replicas' rule 3)."""
    same, how, constant = (t.tolist() if torch.is_tensor(t) else t for t in (same, how, constant))
    rules = (replicas.STATES, replicas.PLACEMENT, replicas.DECLARED)
    reduced.replicated = {key.id for (ph, key), s in zip(keys, same) if s and ph == Phase.TRAIN}
    reduced.placement_source = {key.id: rules[h] for (ph, key), h in zip(keys, how) if ph == Phase.TRAIN}
    doubtful = [phase_label(key.id, ph) for (ph, key), s, h, c in zip(keys, same, how, constant)
                if s and c and h == 0]
    if warn and doubtful:
        warn_user(f"hookstats reduce: {', '.join(doubtful)} held one constant value (all zeros, for one) on every "
                  "tensor-parallel rank and were counted once, as replicated tensors; shards that hold equal values "
                  "look the same. Declare them: mon.reduce(mesh=..., tp=..., sharded=[...]) or replicated=[...].")


def _agree_on_keys(cfg, local, group, world):
    """The union of every rank's (phase, TargetKey), in one order on every rank; checks the configs agree."""
    if world == 1:
        return sorted(local, key=_order)
    meta = [None] * world
    dist.all_gather_object(meta, (cfg, sorted(local, key=_order)), group=group)
    _check_same_config([m[0] for m in meta])
    return sorted({k for m in meta for k in m[1]}, key=_order)


def _pack(cfg, local, keys, device):
    """[K, 5] fstates and [K, S] istates in the order of `keys`; a key this rank lacks gets an empty state."""
    empty_f, empty_i = rawstate.empty(cfg.istate_size, device=device)
    f = torch.stack([local[k][0] if k in local else empty_f for k in keys] or [empty_f])[: len(keys)]
    i = torch.stack([local[k][1] if k in local else empty_i for k in keys] or [empty_i])[: len(keys)]
    return f, i


def _order(k):
    phase, key = k
    return phase, key.id
