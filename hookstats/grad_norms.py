"""The gradient norm by layer, derived on the host from the history's parameter-gradient targets (param_grads=True):
each target's per-step L2 norm is sqrt(M2 + n * mean^2) of its state (the `l2` statistic), the global norm the
root of their sum of squares, as torch.nn.utils.clip_grad_norm_ computes it; a target that saw NaN (Inf) has a NaN
(Inf) norm there, and so has the global one, as in torch. With clip_norm, what a clip_grad_norm_(max_norm=clip_norm)
would do: scale every gradient by clip_norm / (total + 1e-6) where that is below 1.

Under torch.distributed the norms are the rank's own; summed_over(norms, group) makes them the group's: each
target's squared norm summed over the ranks (a sharded gradient's pieces, or targets held by one rank each), in one
all_gather_object at the call, the same result on every rank."""
import dataclasses
import math

import numpy as np

from .checks import check_arg
from .phases import Phase, record_phase
from .targets import Kind

PARAM_GRAD = Kind.PARAM_GRAD
CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s own


@dataclasses.dataclass
class GradNorms:
    """The gradient norm of each parameter per step, from ``mon.grad_norms()`` (and given to the sinks at each flush
    with ``attach(..., param_grads=True, clip_norm=...)``).

    ``steps`` [S]: the recorded steps; ``targets`` [P]: the parameter-gradient targets (``"<name>:param_grad"``);
    ``norms`` [S, P] float64: each parameter's gradient L2 norm (NaN where it has no record at the step or its
    gradient held a NaN, Inf where it held an Inf, as torch's ``clip_grad_norm_`` would give); ``present`` [S, P]:
    which (step, parameter) pairs were measured; ``clip_norm``: the ``max_norm`` of the clipping asked about, or
    None. ``total``, ``share``, ``clip_coef``, ``clipped`` and ``norms_after`` derive from them.
    """

    steps: list
    targets: list
    norms: np.ndarray
    present: np.ndarray
    clip_norm: float = None

    @property
    def total(self):
        """[S]: the global gradient norm of each step, over the targets measured in it."""
        return np.sqrt(np.sum(np.where(self.present, self.norms, 0.0) ** 2, axis=1))

    @property
    def share(self):
        """[S, P]: each parameter's share of the squared global norm (the shares of a step sum to 1)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return self.norms ** 2 / self.total[:, None] ** 2

    @property
    def clip_coef(self):
        """[S]: the factor clip_grad_norm_(max_norm=clip_norm) scales every gradient by (1: not clipped)."""
        if self.clip_norm is None:
            raise ValueError("clip_coef needs a clip_norm: grad_norms(..., clip_norm=max_norm)")
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.minimum(1.0, self.clip_norm / (self.total + CLIP_EPS))

    @property
    def clipped(self):
        """[S] bool: whether the clipping scales the gradients at the step."""
        return self.clip_coef < 1.0

    @property
    def norms_after(self):
        """[S, P]: each parameter's norm after the clipping."""
        return self.norms * self.clip_coef[:, None]

    def rows(self):
        """Yields a dict per step: step, total, with clip_norm clip_coef and clipped, and targets: {target: {norm,
        share, with clip_norm norm_after}} of the parameters measured at the step."""
        total, share = self.total, self.share
        coef = self.clip_coef if self.clip_norm is not None else None
        for s, step in enumerate(self.steps):
            row = {"step": step, "total": float(total[s])}
            if coef is not None:
                row.update(clip_coef=float(coef[s]), clipped=bool(coef[s] < 1.0))
            row["targets"] = {t: {"norm": float(self.norms[s, p]), "share": float(share[s, p]),
                                  **({"norm_after": float(self.norms[s, p] * coef[s])} if coef is not None else {})}
                              for p, t in enumerate(self.targets) if self.present[s, p]}
            yield row


def check_clip_norm(clip_norm):
    """clip_norm: None, or the max_norm of a clip_grad_norm_ (a positive number)."""
    return None if clip_norm is None else check_arg("clip_norm", clip_norm, float, lo=0, lo_open=True)


def target_norms(l2, nan, inf):
    """Per-target norms from the l2 of the finite values and the NaN and Inf counts (arrays of one shape)."""
    norms = np.asarray(l2, dtype=np.float64).copy()
    norms[np.asarray(inf) > 0] = math.inf
    norms[np.asarray(nan) > 0] = math.nan
    return norms


def from_columns(steps, keys, cols, present, clip_norm=None):
    """GradNorms of a flush's columns (records.step_columns: [S, T] arrays; keys [T]: KEY_FIELDS dicts), or None
    when it has no parameter-gradient target."""
    idx = [t for t, k in enumerate(keys) if k["kind"] == PARAM_GRAD and record_phase(k) == Phase.TRAIN]
    if not idx:
        return None
    inf = cols["posinf"][:, idx] + cols["neginf"][:, idx]
    return GradNorms(list(steps), [keys[t]["target"] for t in idx],
                     target_norms(cols["l2"][:, idx], cols["nan"][:, idx], inf),
                     np.asarray(present)[:, idx], check_clip_norm(clip_norm))


def grad_norms(items, clip_norm=None):
    """GradNorms of a history: (step, record) pairs (mon.history_sink.items(), hookstats.sinks.read_history(path)[0]),
    from the train records of the parameter gradients; or a history read as columns (hookstats.sinks.Columns)."""
    if callable(getattr(items, "items_of_kind", None)):
        items = items.items_of_kind(PARAM_GRAD)
    by_step, targets = {}, {}
    for step, rec in items:
        if rec.get("kind") == PARAM_GRAD and record_phase(rec) == Phase.TRAIN:
            by_step.setdefault(step, {})[rec["target"]] = rec
            targets.setdefault(rec["target"], len(targets))
    steps = sorted(by_step)
    norms = np.full((len(steps), len(targets)), np.nan)
    present = np.zeros(norms.shape, dtype=bool)
    for s, step in enumerate(steps):
        for t, rec in by_step[step].items():
            inf = (rec.get("posinf") or 0) + (rec.get("neginf") or 0)
            l2 = rec.get("l2")
            norms[s, targets[t]] = target_norms(np.nan if l2 is None else l2, rec.get("nan") or 0, inf)
            present[s, targets[t]] = True
    return GradNorms(steps, list(targets), norms, present, check_clip_norm(clip_norm))


def check_group(group):
    """grad_norms(group=...): None (this rank's norms), "all" (every rank) or a torch.distributed ProcessGroup;
    returns the group to gather over (None for this rank alone). Needs an initialized process group."""
    if group is None:
        return None
    import torch.distributed as dist
    if not (isinstance(group, str) and group == "all") and not isinstance(group, dist.ProcessGroup):
        raise ValueError(f"group must be None (this rank's norms), \"all\" (every rank) or a torch.distributed "
                         f"ProcessGroup, got {group!r:.60}")
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(f"grad_norms(group={group!r:.40}) sums the norms over ranks: it needs torch.distributed "
                         f"initialized (dist.init_process_group) first")
    group = dist.group.WORLD if isinstance(group, str) else group
    if dist.get_rank(group) < 0:
        raise ValueError("grad_norms(group=...): this process is not a member of the given group")
    return group


def summed_over(norms, group):
    """The GradNorms of every rank of `group` (check_group's) as one: per step and target the root of the ranks'
    summed squared norms, a target present where any rank measured it. The steps are those every rank that has
    parameter gradients kept: a step some rank lacks would miss that rank's part of the norm."""
    import torch.distributed as dist
    gathered = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, (norms.steps, norms.targets, norms.norms, norms.present), group=group)
    parts = [g for g in gathered if g[1]]
    steps = sorted(set.intersection(*(set(g[0]) for g in parts))) if parts else []
    targets = list(dict.fromkeys(t for g in parts for t in g[1]))
    row, col = {s: i for i, s in enumerate(steps)}, {t: i for i, t in enumerate(targets)}
    squares = np.zeros((len(steps), len(targets)))
    present = np.zeros(squares.shape, dtype=bool)
    for rank_steps, rank_targets, rank_norms, rank_present in parts:  # rank order: every rank sums alike
        rows = [(i, row[s]) for i, s in enumerate(rank_steps) if s in row]
        if not rows:
            continue
        src, dst = [i for i, _ in rows], [j for _, j in rows]
        cols = [col[t] for t in rank_targets]
        have = np.asarray(rank_present)[src]
        squares[np.ix_(dst, cols)] += np.where(have, np.asarray(rank_norms)[src], 0.0) ** 2
        present[np.ix_(dst, cols)] |= have
    return GradNorms(steps, targets, np.where(present, np.sqrt(squares), np.nan), present, norms.clip_norm)
