"""reduce()'s rule for parameters copied on every data-parallel rank: under DDP each rank holds the whole weights and,
after its all-reduce, the same gradients, so params=True and param_grads=True targets would enter the merge once per
rank (count and histogram slots times the ranks, and the sample variance's n - 1 taken from that count). A
parameter target that no rank measured as a piece (an FSDP shard, a DTensor sharded over a dimension other than the
tensor-parallel one: states alike over pieces, such as all-zero shards, would be misread) and whose state is the
same bit for bit on every rank of its class enters once per class. Without mesh= the class is the whole group; with
reduce(mesh=..., tp=...) it is the ranks of one tensor-parallel coordinate (what replicas.py decided over the TP
ranks is taken first).

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
    """[world] int: each rank's class (its coordinate on the mesh's `tp` dimension; 0 for every rank without a
    mesh), and the ranks of the first of each class's copies (all other mesh coordinates 0), in rank order."""
    if mesh is None:
        return torch.zeros(world, dtype=torch.int64), [0]
    dim = mesh.mesh_dim_names.index(tp)
    ranks = mesh.mesh.movedim(dim, -1).reshape(-1, mesh.mesh.shape[dim])
    cls = torch.empty(world, dtype=torch.int64)
    for c in range(ranks.shape[1]):
        cls[ranks[:, c]] = c
    return cls, ranks[0].tolist()


def copied(keys, gathered, cls):
    """[K] bool: the parameter targets of which no rank measured a piece whose gathered rows ([world, K,
    FSTATE_SIZE + 3], packed()) are alike bit for bit within every class."""
    pieces = (gathered[:, :, -1] != 0).any(dim=0)
    bits = gathered.view(torch.int64)
    alike = torch.ones(bits.shape[1], dtype=torch.bool, device=bits.device)
    for c in cls.unique().tolist():
        members = bits[(cls == c).nonzero().reshape(-1).to(bits.device)]
        alike &= (members == members[0]).all(dim=2).all(dim=0)
    kind = torch.tensor([key.kind in KINDS for _, key in keys], device=bits.device)
    return alike & kind & ~pieces


def once(f, i, gathered, whole, firsts, copies):
    """(f, i) with the rows `whole` taken once per class: the fstates of the `firsts` ranks merged in rank order, the
    istate sums divided by the number of copies (exact: every copy's slots are alike)."""
    if not bool(whole.any()):
        return f, i
    one = gathered[firsts[0], :, : rawstate.FSTATE_SIZE]
    for r in firsts[1:]:
        one = rawstate.combine(one, gathered[r, :, : rawstate.FSTATE_SIZE])
    return torch.where(whole[:, None], one, f), torch.where(whole[:, None], i // copies, i)
