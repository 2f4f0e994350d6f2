"""reduce(mesh=..., tp=...)'s rule for targets of a tensor-parallel model: which ones are replicated over the
tensor-parallel (TP) group, to be counted once, and which are sharded over it, to be merged.

A module's output inside a TP region is either the same tensor on every rank of the TP group (a LayerNorm's
output, a row-parallel output after its all-reduce, the gradients into them) or one part of a larger tensor (a
column-parallel output, a sequence-parallel norm's output, a row-parallel output after its reduce-scatter).
Each target is decided by the first of these that speaks:
  1. the user's declaration: reduce(..., sharded=[patterns], replicated=[patterns]), glob patterns of target ids;
  2. the placement of the DTensor measured for it (StateStore.placement): Shard over the TP dimension is sharded,
     Replicate replicated (a Partial one is never measured);
  3. its states: the same bit for bit on every rank of the group (count, moments, min/max, every histogram slot)
     is replicated; any other is sharded, a count that differs between the ranks first of all.
Rule 3 reads one case wrongly: shards holding exactly the same values (all zeros on every rank) are taken for
one replicated tensor. It cannot be told from a constant replicated tensor, so a target rule 3 counts once whose
values are all equal (min == max) is named in a warning.

Only the group's first rank contributes a replicated target to the merge. The comparison costs one all_gather
over the TP group of K x 8 numbers (the fstate's bits, two weighted sums of the istate, the placement seen), K
the number of targets: no state is sent whole.
"""
import fnmatch

import torch
import torch.distributed as dist

from . import rawstate

UNKNOWN, REPLICATED, SHARDED = 0, 1, 2  # what a placement says; SHARDED the highest: see decide()
STATES, PLACEMENT, DECLARED = "states", "placement", "declared"  # what decided a target (Reduced.placement_source)

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


def patterns(name, given):
    """A sharded=/replicated= argument as a tuple of glob patterns (one str is one pattern), checked."""
    pats = [given] if isinstance(given, str) else given
    try:
        pats = tuple(pats)
    except TypeError:
        pats = (given,)
    bad = [p for p in pats if not isinstance(p, str) or not p]
    if bad:
        raise ValueError(f"hookstats reduce: {name}= takes glob patterns of target ids (e.g. ['*.up:output']), got "
                         f"{bad[0]!r}")
    return pats


def declared(ids, sharded, replicated):
    """(codes, error): per id, SHARDED, REPLICATED or UNKNOWN as the patterns declare it; error, the message of a
    pattern that matches no id or of an id both lists match (None when there is none). ids: every target id."""
    unknown = [p for p in (*sharded, *replicated) if not any(fnmatch.fnmatchcase(i, p) for i in ids)]
    if unknown:
        some = ", ".join(sorted(set(ids))[:6])
        return None, (f"hookstats reduce: no target matches {unknown} (sharded=/replicated= take glob patterns of "
                      f"target ids, such as {some or 'none: no target was measured'})")
    codes = []
    for i in ids:
        s, r = (any(fnmatch.fnmatchcase(i, p) for p in pats) for pats in (sharded, replicated))
        if s and r:
            return None, f"hookstats reduce: {i} matches both sharded= and replicated=; declare it once"
        codes.append(SHARDED if s else REPLICATED if r else UNKNOWN)
    return codes, None


def seen(placement, tp):
    """What placement (StateStore.placement) says of the mesh dimension tp: SHARDED, REPLICATED or UNKNOWN (no
    DTensor measured, or one over a mesh without that dimension)."""
    kind = dict(placement or ()).get(tp)
    return SHARDED if kind == "shard" else REPLICATED if kind == "replicate" else UNKNOWN


def decide(f, i, tp_group, placed, declared_codes):
    """(same, how): same [K] bool on f's device, the targets replicated over tp_group; how [K] int, the rule that
    decided each (0 states, 1 placement, 2 declared). placed: [K] codes of the placements this rank saw;
    declared_codes: [K] codes the user declared (the same on every rank)."""
    fp = torch.cat([fingerprints(f, i), placed.to(f.device, torch.int64)[:, None]], 1)
    tp = dist.get_world_size(tp_group)
    gathered = torch.empty((tp,) + tuple(fp.shape), dtype=fp.dtype, device=fp.device)
    all_gather_single(gathered.view(-1), fp.reshape(-1), group=tp_group)
    alike = (gathered[:, :, :-1] == gathered[0, :, :-1]).all(dim=2).all(dim=0)
    # ranks that saw different placements: sharded, the reading that never drops a rank's values
    placed = gathered[:, :, -1].amax(dim=0)
    mine = declared_codes.to(f.device, torch.int64)
    code = torch.where(mine != UNKNOWN, mine, placed)
    same = torch.where(code == UNKNOWN, alike, code == REPLICATED)
    how = torch.where(mine != UNKNOWN, 2, torch.where(placed != UNKNOWN, 1, 0))
    return same, how


def constant(f):
    """[K] bool: the targets with values whose values are all equal (min == max), all zeros among them."""
    return (f[:, rawstate.N_FINITE] > 0) & (f[:, rawstate.MIN] == f[:, rawstate.MAX])


def keep_one_copy(f, i, same, first):
    """(f, i) with the rows marked `same` emptied unless this rank is its TP group's first (`first`): every
    replicated target then enters the merge once per data-parallel replica."""
    if first:
        return f, i
    empty_f, _ = rawstate.empty(i.shape[1], device=f.device)
    return torch.where(same[:, None], empty_f, f), torch.where(same[:, None], torch.zeros_like(i), i)
