"""The raw state of one target as a table: per field its name, part (fstate float64 or istate int64), slots for a
config, empty value, merge rule and per-step rule. empty() and combine() are the one empty state and the one
merge, on NumPy arrays and torch tensors alike: calls, steps, the history ring, reduce() and the reference use them.
The kernels merge the same way (csrc/accumulator.h chan_merge, fmin_nan/fmax_nan, istate sums)."""
import dataclasses
import functools
import math
import os
import re
from typing import Callable

import numpy as np

from . import _build
from .tensor_kind import torch_of

FSTATE, ISTATE = "fstate", "istate"
# merge rules: CHAN the moments (n, mean, M2) by Chan et al.'s pairwise merge, in order (b after a); FMIN/FMAX by
# minNum/maxNum (NaN = empty); SUM exact int64 counts
CHAN, FMIN, FMAX, SUM = "chan", "fmin", "fmax", "sum"
# per-step rules of the history: STEP what the step measured itself, RUNNING since attach or reset(), GROWTH
# the counts' growth since the previous step, WINDOW the growth since the previous flush (with its last step)
STEP, RUNNING, GROWTH, WINDOW = "step", "running", "growth", "window"


# The layout's rows: csrc/state_layout.def, which csrc/accumulator.h includes. The istate's numbering, only what the
# flags measure:
#   counters (count, near_zero) | [under | nbins bins | over] (LINEAR_HIST) | NaN | +Inf | -Inf | [log2] (LOG_HIST)
#   | [float] (FLOAT_HIST)
LAYOUT_FILE = "state_layout.def"


def read_layout(text):
    """csrc/state_layout.def's rows, as {kind: [args, ...]} in file order: every HS_KIND(a, b) line's args, integers
    as ints and names as str. Comment and preprocessor lines are skipped; anything else raises ValueError."""
    rows = {}
    for k, line in enumerate(text.splitlines(), 1):
        line = line.split("//", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"HS_([A-Z_]+)\(([^()]*)\)", line)
        if m is None:
            raise ValueError(f"{LAYOUT_FILE}:{k}: not a layout row: {line!r}")
        args = [a.strip() for a in m.group(2).split(",")]
        rows.setdefault(m.group(1), []).append([int(a) if re.fullmatch(r"-?\d+", a) else a for a in args])
    return rows


def snake_case(name):
    """A row's CamelCase name as Python spells it, in lower_snake (NearZero: near_zero, NFinite: n_finite)."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def _layout_path():
    root = _build.source_dir()
    if root is None:
        raise ImportError("hookstats: csrc/ (hookstats/_csrc/ when installed) is missing, and with it the state "
                          f"layout ({LAYOUT_FILE}): reinstall hookstats")
    return os.path.join(root, LAYOUT_FILE)


LAYOUT_PATH = _layout_path()  # csrc/state_layout.def in a clone, hookstats/_csrc/state_layout.def installed
with open(LAYOUT_PATH, encoding="utf-8") as _f:
    ROWS = read_layout(_f.read())
# every constant by its Python name, as accumulator.h derives it where it does
CONSTANTS = {
    "LAYOUT_VERSION": ROWS["LAYOUT_VERSION"][0][0],
    **{snake_case(name).upper(): k for k, (name,) in enumerate(ROWS["COUNTER"])},
    "LIN_BASE": len(ROWS["COUNTER"]),
    **{snake_case(name).upper(): bit for name, bit in ROWS["FLAG"]},
    **{snake_case(name).upper(): value for name, value in ROWS["CONST"]},
}
# the op counters' istate slots by field name: a counter's row in state_layout.def is all it takes to appear here
COUNTERS = {snake_case(name): k for k, (name,) in enumerate(ROWS["COUNTER"])}
COUNT, NEAR_ZERO, LIN_BASE = COUNTERS["count"], COUNTERS["near_zero"], CONSTANTS["LIN_BASE"]
LIN_EXTRA = CONSTANTS["LIN_EXTRA"]
LOG_SLOTS = CONSTANTS["LOG_SLOTS"]
LOG_EXP_MIN = CONSTANTS["LOG_EXP_MIN"]
MAX_BINS = CONSTANTS["MAX_BINS"]

LINEAR_HIST, LOG_HIST = CONSTANTS["LINEAR_HIST"], CONSTANTS["LOG_HIST"]
SIGNED_NEAR_ZERO, FLOAT_HIST = CONSTANTS["SIGNED_NEAR_ZERO"], CONSTANTS["FLOAT_HIST"]
HIST_FLAGS = LINEAR_HIST | LOG_HIST | FLOAT_HIST
# the enabled flag's values: 0 off, 1 everything, 1 | SKIP_HIST (3) all but the histograms (accumulator.h kSkipHist)
SKIP_HIST = CONSTANTS["SKIP_HIST"]

FLOAT_MANT_BITS = CONSTANTS["FLOAT_MANT_BITS"]
FLOAT_SHIFT = 23 - FLOAT_MANT_BITS
FLOAT_HALF = 1 << (31 - FLOAT_SHIFT)  # slots per sign: + half first, then - half
FLOAT_SLOTS = 2 * FLOAT_HALF
FLOAT_BELOW, FLOAT_ABOVE, FLOAT_ZERO = FLOAT_HALF - 3, FLOAT_HALF - 2, FLOAT_HALF - 1

# The layout saved with what holds slots (JSONL histories, checkpoints), since a reader of another layout would
# misread every bucket: state_layout.def's HS_LAYOUT_VERSION, raised with any change to what a slot means
# (tests/test_layout_source.py fails on a layout that an older version already named); the slot counts catch a
# change that forgot to.
LAYOUT_VERSION = CONSTANTS["LAYOUT_VERSION"]
LAYOUT = {"version": LAYOUT_VERSION, "float_slots": FLOAT_SLOTS, "log_slots": LOG_SLOTS}
UNSTAMPED = {"version": 1, "float_slots": 4096, "log_slots": 256}  # files and checkpoints saved without a layout


def other_layout(saved):
    """None when `saved` (a LAYOUT read back from a file or checkpoint; None: saved without one) is this version's
    layout, else one line saying which layout it is and that its slots cannot be read here."""
    saved = UNSTAMPED if saved is None else saved
    if saved == LAYOUT:
        return None
    return (f"its slots are of state layout {_describe(saved)}, and this version of hookstats reads layout "
            f"{_describe(LAYOUT)} alone")


def _describe(layout):
    if not (isinstance(layout, dict) and all(isinstance(layout.get(k), int) for k in LAYOUT)):
        return f"{layout!r:.80} (not a layout)"
    return f"{layout['version']} ({layout['float_slots']} float buckets, {layout['log_slots']} log2 slots)"


def lin_slots(nbins):
    """The kernels' linear numbering: under, nbins bins, over, NaN, +Inf, -Inf."""
    return nbins + LIN_EXTRA


def kept_first(nbins, flags):
    """Where the istate's window of the kernels' numbering starts: at under with the linear bins, else at NaN."""
    return 0 if flags & LINEAR_HIST else nbins + 2


def nonfinite_base(nbins, flags):
    """istate index of the NaN counter (+Inf, -Inf follow)."""
    return LIN_BASE + nbins + 2 - kept_first(nbins, flags)


def log_base(nbins, flags):
    return nonfinite_base(nbins, flags) + 3


def float_base(nbins, flags):
    return log_base(nbins, flags) + (LOG_SLOTS if flags & LOG_HIST else 0)


def istate_size(nbins, flags):
    return float_base(nbins, flags) + (FLOAT_SLOTS if flags & FLOAT_HIST else 0)



@dataclasses.dataclass(frozen=True)
class Field:
    """One raw field: slots(nbins, flags) -> (start, size) in its part (size 0: the flags keep none)."""
    name: str
    part: str
    slots: Callable[[int, int], tuple]
    empty: float
    merge: str
    step: str


def _f(k):
    return lambda nbins, flags: (k, 1)


def _i(start, size, flag=None):
    """istate slots at start(nbins, flags), size(nbins, flags) of them where the layout flag `flag` (an int) is on."""
    def slots(nbins, flags):
        kept = flag is None or flags & flag
        return start(nbins, flags), size(nbins, flags) if kept else 0
    return slots


# state_layout.def's merge and per-step rules by name; an fstate field's empty value follows from its merge
_RULE = {"Chan": CHAN, "FMin": FMIN, "FMax": FMAX, "Step": STEP, "Running": RUNNING}
_EMPTY = {CHAN: 0.0, FMIN: math.nan, FMAX: math.nan}
FIELDS = (
    # the fstate in slot order: moments of the finite values, then min/max (NaN while empty)
    *(Field(snake_case(name), FSTATE, _f(k), _EMPTY[_RULE[merge]], _RULE[merge], _RULE[step])
      for k, (name, merge, step) in enumerate(ROWS["FSLOT"])),
    # the op counters, one slot each
    *(Field(snake_case(name), ISTATE, _i(lambda n, f, k=k: k, lambda n, f: 1), 0, SUM, GROWTH)
      for k, (name,) in enumerate(ROWS["COUNTER"])),
    # under, nbins bins, over
    Field("linear", ISTATE, _i(lambda n, f: LIN_BASE, lambda n, f: n + 2, LINEAR_HIST), 0, SUM, GROWTH),
    # NaN, +Inf, -Inf
    Field("nonfinite", ISTATE, _i(lambda n, f: nonfinite_base(n, f), lambda n, f: 3), 0, SUM, GROWTH),
    Field("log2", ISTATE, _i(lambda n, f: log_base(n, f), lambda n, f: LOG_SLOTS, LOG_HIST), 0, SUM,
          GROWTH),
    Field("float_buckets", ISTATE,
          _i(lambda n, f: float_base(n, f), lambda n, f: FLOAT_SLOTS, FLOAT_HIST), 0, SUM, WINDOW),
)
BY_NAME = {fd.name: fd for fd in FIELDS}
FSTATE_FIELDS = tuple(fd for fd in FIELDS if fd.part == FSTATE)
FSTATE_SIZE = len(FSTATE_FIELDS)
N_FINITE, MEAN, M2, MIN, MAX = (BY_NAME[n].slots(0, 0)[0] for n in ("n_finite", "mean", "m2", "min", "max"))
_EMPTY_F = tuple(fd.empty for fd in FSTATE_FIELDS)
_RUNNING = tuple(fd.step == RUNNING for fd in FSTATE_FIELDS)


def invalid(fstate, istate, nbins, flags):
    """The first field of a state (fstate, istate: 1-d NumPy arrays of a config's sizes) that breaks its
    invariant, as "field 'name': why", or None. SUM fields are counts: non-negative, none but `count` itself above
    `count` (each value is counted once at most); the moments: n_finite a whole number in 0..count, a finite mean,
    M2 >= 0; min <= max."""
    count = int(istate[COUNT])
    n = float(fstate[N_FINITE])
    for fd in sorted(FIELDS, key=lambda fd: fd.name != "count"):  # count first: it bounds the others
        start, size = fd.slots(nbins, flags)
        v = (fstate if fd.part == FSTATE else istate)[start:start + size]
        if fd.merge == SUM:
            if (v < 0).any():
                return f"field {fd.name!r}: a negative count ({int(v.min())})"
            if fd.name != "count" and int(v.sum()) > count:
                return f"field {fd.name!r}: counts {int(v.sum())} values, more than count ({count})"
        elif fd.name == "n_finite" and not (0 <= n <= count and n == math.floor(n)):
            return f"field 'n_finite': {n!r} is not a whole number in 0..count ({count})"
        elif fd.name == "mean" and not math.isfinite(v[0]):
            return f"field 'mean': {float(v[0])!r} is not finite"
        elif fd.name == "m2" and v[0] < 0:
            return f"field 'm2': {float(v[0])!r} is negative"
        elif fd.name == "max" and fstate[MIN] > fstate[MAX]:
            return f"field 'max': {float(fstate[MAX])!r} is below min ({float(fstate[MIN])!r})"
    return None


def slots(name, nbins, flags):
    """The slice of field `name` in its part for a state of (nbins, flags)."""
    start, size = BY_NAME[name].slots(nbins, flags)
    return slice(start, start + size)


def step_slots(nbins, flags):
    """The istate slots a history ring keeps per step: the GROWTH fields, which come before the WINDOW ones."""
    return max(sum(BY_NAME[fd.name].slots(nbins, flags)) for fd in FIELDS if fd.part == ISTATE and fd.step == GROWTH)


def running_mask(device=None):
    """[FSTATE_SIZE] bool: the fstate fields a step's record takes from the running totals (RUNNING), the others
    from what the step measured (STEP)."""
    import torch
    return torch.tensor(_RUNNING, device=device)


def empty(istate_size=None, shape=(), device=None, numpy=False):
    """The empty state, combine()'s identity, over leading dimensions `shape`: (fstate float64 [*shape, F],
    istate int64 [*shape, istate_size]), or the fstate alone with istate_size None. torch tensors on `device`,
    or NumPy arrays with numpy=True."""
    shape = tuple(shape)
    if numpy:
        f = np.broadcast_to(np.array(_EMPTY_F, dtype=np.float64), shape + (FSTATE_SIZE,)).copy()
        return f if istate_size is None else (f, np.zeros(shape + (istate_size,), dtype=np.int64))
    import torch
    f = torch.tensor(_EMPTY_F, dtype=torch.float64, device=device)
    f = f.expand(shape + (FSTATE_SIZE,)).clone() if shape else f
    return f if istate_size is None else (f, torch.zeros(shape + (istate_size,), dtype=torch.int64, device=device))


def combine(a, b):
    """State b merged into state a (b's values after a's: Chan's merge is ordered), field by field by the table's
    rules, as the kernels merge: (fstate, istate) pairs, or fstate rows alone ([..., F] float64, a and b of one
    shape). NumPy arrays or torch tensors; a new state, a and b untouched."""
    if isinstance(a, tuple):
        return combine(a[0], b[0]), a[1] + b[1]  # every istate field is a SUM
    torch = torch_of(a)
    if torch is not None:
        return _combine_f(a, b, _torch_ops(torch))
    with np.errstate(invalid="ignore"):  # NaN - NaN in an empty min/max is no error
        return _combine_f(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), _NUMPY)


def combine_all(states):
    """combine() of a sequence of states (at least one), in order."""
    out = None
    for s in states:
        out = s if out is None else combine(out, s)
    return out


def _groups():
    """[(rule, slice)]: the fstate fields by merge rule, each rule's fields consecutive, in slot order."""
    out = []
    for k, fd in enumerate(FSTATE_FIELDS):
        if out and out[-1][0] == fd.merge:
            out[-1] = (fd.merge, slice(out[-1][1].start, k + 1))
        else:
            assert fd.merge not in (r for r, _ in out), f"the {fd.merge} fields of the fstate are consecutive"
            out.append((fd.merge, slice(k, k + 1)))
    return tuple(out)


_GROUPS = _groups()


class _Ops:
    def __init__(self, where, fmin, fmax, stack, at_least_1, unbind):
        self.where, self.fmin, self.fmax, self.stack = where, fmin, fmax, stack
        self.at_least_1, self.unbind = at_least_1, unbind


@functools.cache
def _torch_ops(torch):
    return _Ops(torch.where, torch.fmin, torch.fmax, lambda xs: torch.stack(xs, dim=-1), lambda x: x.clamp(min=1),
                lambda x: x.unbind(-1))


_NUMPY = _Ops(np.where, np.fmin, np.fmax, lambda xs: np.stack(xs, axis=-1), lambda x: np.maximum(x, 1),
              lambda x: tuple(np.moveaxis(x, -1, 0)))


def _chan(a, b, ops):
    """(n, mean, M2) of b merged into a's, as csrc/accumulator.h chan_merge (the same float64 operations): a's where b
    is empty, b's where a is. n and the mean need no branch (an empty state's n and mean are 0: na + 0, ma + d * 0
    and 0 + mb * 1 are exact); M2 does (d * d overflows past 1.3e154, and inf * 0 is NaN)."""
    (na, ma, m2a), (nb, mb, m2b) = a, b
    with np.errstate(all="ignore"):
        n = na + nb
        d = mb - ma
        frac = nb / ops.at_least_1(n)
        # over float64's whole range, as chan_merge: a d past DBL_MAX (opposite means near it) takes the weighted
        # sum; a cross term that overflows is regrouped (it may fit)
        finite_d = d - d == 0
        mean = ops.where(finite_d, ma + d * frac, ma * (na / ops.at_least_1(n)) + mb * frac)
        cross = d * d * na * frac
        cross = ops.where((cross - cross == 0) | ~finite_d, cross, d * (d * (na * frac)))
        m2 = ops.where(nb == 0, m2a, ops.where(na == 0, m2b, m2a + m2b + cross))
        mean = ops.where(nb == 0, ma, ops.where(na == 0, mb, mean))
    return [n, mean, m2]


_RULES = {CHAN: _chan, FMIN: lambda a, b, ops: [ops.fmin(a[0], b[0])],
          FMAX: lambda a, b, ops: [ops.fmax(a[0], b[0])], SUM: lambda a, b, ops: [a[0] + b[0]]}


def _combine_f(a, b, ops):
    fa, fb = ops.unbind(a), ops.unbind(b)
    return ops.stack([v for rule, sl in _GROUPS for v in _RULES[rule](fa[sl], fb[sl], ops)])
