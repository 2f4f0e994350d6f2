"""reduce()'s rule for parameters copied on every data-parallel rank: under DDP each rank holds the whole weights and,
after its all-reduce, the same gradients, so params=True and param_grads=True targets would enter the merge once per
rank (count and histogram slots times the ranks, and the sample variance's n - 1 taken from that count). A
parameter target that no rank measured as a piece (an FSDP shard, a DTensor sharded over a dimension other than the
tensor-parallel one: states alike over pieces, such as all-zero shards, would be misread) and whose state is the
same bit for bit on every rank of its class that holds one enters once per class. Without mesh= the class is the
whole group; with reduce(mesh=..., tp=...) it is the ranks of one tensor-parallel coordinate (what replicas.py
decided over the TP ranks is taken first). Ranks without a state of the target do not count: pipeline stages of DDP
hold each other's parameters on no rank.

It reads what the all_gather of the fstates carries anyway, plus the two weighted sums of each istate
(replicas.fingerprints): no collective of its own.
"""
import torch

from . import rawstate, replicas
from .targets import Kind

KINDS = (Kind.PARAM, Kind.PARAM_GRAD)


def piece(store, key, tp=None):
    """Whether this rank measured key through its part of a DTensor sharded over some dimension other than `tp` (an
    FSDP shard), or over a mesh without dimension names (which cannot say)."""
    if not store.read_through_local_part(key):
        return False
    placement = store.placement(key)
    return placement is None or any(kind == "shard" for name, kind in placement if name != tp)


def packed(f, i, pieces):
    """[K, FSTATE_SIZE + 3] float64, what the all_gather carries: the fstates, the bits of two weighted sums of each
    istate, and 1 where this rank measured a piece of the target (pieces: [K] bool, piece()), else 0."""
    sums = replicas.fingerprints(f, i)[:, rawstate.FSTATE_SIZE:]
    return torch.cat([f, sums.contiguous().view(torch.float64), pieces.to(f.device, f.dtype)[:, None]], 1)


def classes(world, mesh=None, tp="tp"):
    """[world] int: each rank's class, its coordinate on the mesh's `tp` dimension (0 for every rank without a mesh)."""
    cls = torch.zeros(world, dtype=torch.int64)
    if mesh is not None:
        dim = mesh.mesh_dim_names.index(tp)
        ranks = mesh.mesh.movedim(dim, -1).reshape(-1, mesh.mesh.shape[dim])
        for c in range(ranks.shape[1]):
            cls[ranks[:, c]] = c
    return cls


def merge(keys, gathered, cls, istate_size):
    """(f, copies): the fstates of every rank merged in rank order ([K, FSTATE_SIZE]), but for the parameter targets
    copied on the ranks of each class, of which only each class's first copy enters; copies [K] int64, the number
    of copies of each target in a class (1 where it is not copied), by which the summed istates are divided (exact:
    the copies' slots are alike). gathered: [world, K, FSTATE_SIZE + 3], packed() of every rank. A rank without a
    state of a target (another pipeline stage's parameter, a rank of the tensor-parallel group that kept no copy)
    is no copy of it."""
    world, k = gathered.shape[:2]
    bits = gathered.view(torch.int64)
    empty_f, empty_i = rawstate.empty(istate_size, device=gathered.device)
    blank = packed(empty_f[None], empty_i[None], torch.zeros(1, dtype=torch.bool)).view(torch.int64)[0]
    held = (bits != blank).any(dim=2)  # [world, K]
    keep = torch.ones(world, k, dtype=torch.bool, device=bits.device)
    copied = torch.tensor([key.kind in KINDS for _, key in keys], device=bits.device)
    copied &= ~(gathered[:, :, -1] != 0).any(dim=0)  # some rank measured a piece
    copies = torch.zeros(k, dtype=torch.int64, device=bits.device)
    for c in cls.unique().tolist():
        members = (cls == c).nonzero().reshape(-1).to(bits.device)
        mine, has = bits[members], held[members]
        first = has.to(torch.int8).argmax(dim=0)  # the first member holding a state (0 where none does)
        ref = mine[first, torch.arange(k, device=bits.device)]
        copied &= ((mine == ref).all(dim=2) | ~has).all(dim=0)
        n = has.sum(dim=0)
        copied &= (n == 0) | (copies == 0) | (n == copies)  # as many copies in every class: the division is exact
        copies = torch.maximum(copies, n)
        keep[members] = torch.arange(len(members), device=bits.device)[:, None] == first
    keep |= ~copied
    f = torch.where(keep[:, :, None], gathered[:, :, : rawstate.FSTATE_SIZE], empty_f)
    merged = f[0]
    for r in range(1, world):
        merged = rawstate.combine(merged, f[r])
    return merged, torch.where(copied, copies.clamp(min=1), 1)
