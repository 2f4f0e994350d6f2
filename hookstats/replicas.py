"""reduce(mesh=..., tp=...)'s rule for targets of a tensor-parallel model: which ones are replicated over the
tensor-parallel (TP) group, to be counted once, and which are sharded over it, to be merged.

A module's output inside a TP region is either the same tensor on every rank of the TP group (a LayerNorm's
output, a row-parallel output after its all-reduce, the gradients into them) or one part of a larger tensor (a
column-parallel output, a sequence-parallel norm's output, a row-parallel output after its reduce-scatter). A
plain tensor does not say which, so the states say it: a target whose state (count, moments, min/max, every
histogram slot) is the same bit for bit on every rank of the TP group holds the same values there and is
replicated; any other is sharded. Only the group's first rank contributes a replicated target to the merge.
The one case this reads wrongly: shards that hold exactly the same values (all zeros on every rank) are taken
for one replicated tensor and counted once.

The comparison costs one all_gather over the TP group of K x 7 numbers (the fstate's bits and two weighted sums
of the istate), K the number of targets: no state is sent whole.
"""
import torch
import torch.distributed as dist

from . import rawstate

all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def tp_group_of(mesh, tp):
    """The process group of `mesh`'s dimension `tp`, after checking that mesh is a DeviceMesh over every rank
    that has such a dimension: the one clear error of reduce(mesh=...)."""
    names = getattr(mesh, "mesh_dim_names", None)
    if not hasattr(mesh, "get_group"):
        raise ValueError(f"hookstats reduce: mesh must be a torch.distributed DeviceMesh (init_device_mesh), got "
                         f"{type(mesh).__name__}")
    if not names or tp not in names:
        raise ValueError(f"hookstats reduce: the mesh has no dimension named {tp!r} (its dimensions: {names}); "
                         f"name the tensor-parallel one with tp=, e.g. mon.reduce(mesh=world_mesh, tp='tp')")
    if mesh.size() != dist.get_world_size():
        raise ValueError(f"hookstats reduce: the mesh spans {mesh.size()} ranks of {dist.get_world_size()}; give "
                         f"the whole mesh (every rank calls reduce(), which merges over all of them)")
    return mesh.get_group(tp)


def fingerprints(f, i):
    """[K, 7] int64 per target: the fstate's 5 float64 as bits and two weighted sums of the istate (as bits), equal
    on two ranks exactly when their states are, but for a chance collision of both sums."""
    w = torch.Generator().manual_seed(0x5eed)
    weights = torch.rand(2, i.shape[1], generator=w, dtype=torch.float64).add_(0.5).to(i.device)
    sums = (i.to(torch.float64)[:, None, :] * weights).sum(dim=2)  # same shapes, same reduction order: same bits
    return torch.cat([f.contiguous().view(torch.int64), sums.contiguous().view(torch.int64)], 1)


def replicated(f, i, tp_group):
    """[K] bool on f's device: the targets whose state is the same on every rank of tp_group."""
    fp = fingerprints(f, i)
    tp = dist.get_world_size(tp_group)
    gathered = torch.empty((tp,) + tuple(fp.shape), dtype=fp.dtype, device=fp.device)
    all_gather_single(gathered.view(-1), fp.reshape(-1), group=tp_group)
    return (gathered == gathered[0]).all(dim=2).all(dim=0)


def keep_one_copy(f, i, same, first):
    """(f, i) with the rows marked `same` emptied unless this rank is its TP group's first (`first`): every
    replicated target then enters the merge once per data-parallel replica."""
    if first:
        return f, i
    empty_f, _ = rawstate.empty(i.shape[1], device=f.device)
    return torch.where(same[:, None], empty_f, f), torch.where(same[:, None], torch.zeros_like(i), i)
