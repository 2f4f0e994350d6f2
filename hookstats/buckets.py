"""What the host reads from the float buckets (layout.FLOAT_*): the log2 histogram, the shares each low-precision
format cannot hold, quantiles of x and |x|, near-zero shares and a linear histogram view fitted to the data.
Every function takes counts [..., FLOAT_SLOTS] (int, the state's slot order; or prepare(counts), checked once for
several derivations) and works on all leading dimensions at once (targets, steps); NaN/Inf are not in the buckets, so every share is of the finite values, zeros included,
and an empty row gives NaN.

Buckets by magnitude (each sign alike): exact zero | float64 in (0, 2**-149) | 8 linear sub-buckets of float32's
subnormals, [k, k+1) * 2**-129 (k = 0 starts at 2**-149) | log-linear [(8+m), (9+m)) * 2**(e-3) for e = -126..127,
m = 0..7 | float64 >= 2**128. Bucket edges ("edges" below) are 0, 2**-149, k * 2**-129 and (1 + m/8) * 2**e: every
power of two from 2**-129 to 2**128, and 2**-149 (the powers between lie inside the first subnormal sub-bucket).

Quantiles. Rank rule: numpy.quantile's method="inverted_cdf" over the n finite values sorted ascending, i.e. the
order statistic x_(r) with r = max(1, ceil(q * n)) (computed as NumPy does, in float64). The estimate comes from
the bucket [a, b) holding rank r, narrowed to [minimum, maximum] when those are given, interpolated within it as
Prometheus' native histograms and HdrHistogram do: the bucket's c values are taken as spread evenly over it, rank
r being the k-th of them (k = r - the count before the bucket), at fraction f = (k - 1/2) / c of the way from a
to b:
- zero: exact; r = 1 with `minimum` given: exactly `minimum`; r = n with `maximum`: exactly `maximum`;
- log-linear buckets (a fixed ratio b / a <= 9/8): log-linearly, a * (b / a)**f (Prometheus' exponential
  buckets' rule); relative error |est - x| / |x| < (b - a) / a <= 1/8 (QUANTILE_REL_ERROR), reached only by a
  point mass at a bucket's edge away from the known min/max;
- below 2**-126 (subnormal sub-buckets, float64 below 2**-149): linearly, a + f * (b - a), absolute error
  < 2**-129 (QUANTILE_ABS_ERROR);
- float64 >= 2**128: 2**128, or the bucket narrowed by `maximum`; no bound (no float32 value lands there).
So |est - x| <= max(QUANTILE_REL_ERROR * |x|, QUANTILE_ABS_ERROR) for every |x| < 2**128. Measured against
NumPy over 10^5 values (PYTHONPATH=. python benchmarks/quantile_error.py; benchmarks/results/quantile_error.json),
the relative error of p1/p50/p99 without min/max: on smooth data (normal, lognormal, uniform, a ReLU'd normal,
layer-normalised rows) median 0.12%, largest 3.4% (the p50 of a ReLU output, a value near 0), where the bucket
midpoint gave 2.4% and 5.0% and the same three figures for every normalised tensor; on spiky data a point mass
inside one bucket is where the spread is assumed wrongly: point masses up to 10%, all-equal data up to 7.1% (the
midpoint: 4.8%, 2.5%), a few huge outliers 0.7%; with min/max known (stats()) all-equal data is exact.

Near zero. near_zero(counts, t) is the exact share of |x| < t for any edge t. The default figure,
relative_near_zero(), is the share of values more than 2**10 (about 1000x) below the target's own scale: t is the
power of two 2**(E - 10), E the binary exponent of the p99 of |x| (floor(log2 p99)). E is exact, not an estimate
(a log-linear bucket lies inside one binade), and t is an edge, so the share is exact. Why: a fixed |x| <= 1e-6 is
0% on every output and 100% on a small gradient; a scale-relative threshold says "how much of this tensor is
negligible next to its own large values": below 2**(E - 10) is below one fp16 ulp of a value at the scale and
an eighth of a bf16 ulp, so added to scale-sized values in 16-bit arithmetic they change at most its last bit.
The p99 (not the max or the rms) keeps a few outliers from moving the threshold. N(0, 1) gives ~0.16%, a ReLU
output its zero share plus a little, a dead unit 100%. Exact zeros always count; if the p99 itself is zero (>= 99%
zeros) the figure is the share of exact zeros.

Linear view: linear_view() spreads each bucket's count uniformly over the bucket's span (an assumption: the
buckets do not say where inside a bucket the values lie; zero and the float64 end buckets are points), over
`nbins` equal bins from the bucket holding the p0.1 to the one holding the p99.9 (narrowed to [minimum, maximum]);
values beyond go to the outer bins, and the cumulative counts are rounded so the bins are integers that add up to
exactly n. A degenerate span widens to the occupied buckets, then to +-1/8 of the value (+-1 around zero).
"""
import numpy as np

from . import layout

DEFAULT_QUANTILES = (0.001, 0.01, 0.5, 0.99, 0.999)
QUANTILE_REL_ERROR = 1 / 8
QUANTILE_ABS_ERROR = 2.0 ** -129
NEAR_ZERO_BELOW_LOG2 = 10
NEAR_ZERO_SCALE_Q = 0.99

# name: (smallest subnormal, smallest normal, largest finite value)
FORMATS = {"fp16": (2.0 ** -24, 2.0 ** -14, 65504.0),
           "bf16": (2.0 ** -133, 2.0 ** -126, float.fromhex("0x1.fep127")),
           "fp8 e4m3": (2.0 ** -9, 2.0 ** -6, 448.0),
           "fp8 e5m2": (2.0 ** -16, 2.0 ** -14, 57344.0)}

_H = layout.FLOAT_HALF
_SUB = 1 << layout.FLOAT_MANT_BITS  # sub-buckets per binade
_FINITE = 255 * _SUB  # slots 0.._FINITE-1 hold float32's finite nonzero magnitudes
_ZERO, _BELOW, _ABOVE = layout.FLOAT_ZERO, layout.FLOAT_BELOW, layout.FLOAT_ABOVE


def _magnitude_table():
    """Nonzero slots of one sign by increasing magnitude, with each bucket's [lower, upper) and whether its
    quantile estimate is the linear midpoint."""
    k = np.arange(_FINITE)
    e, m = k // _SUB, k % _SUB
    lower = np.where(e == 0, k * 2.0 ** (-126 - layout.FLOAT_MANT_BITS),
                     (_SUB + m) * np.exp2(e - 127.0 - layout.FLOAT_MANT_BITS))
    lower[0] = 2.0 ** -149
    lower = np.concatenate([[0.0], lower, [2.0 ** 128]])
    upper = np.concatenate([lower[1:], [np.inf]])
    slots = np.concatenate([[_BELOW], k, [_ABOVE]])
    return slots, lower, upper, lower < 2.0 ** -126


_MAG_SLOTS, _MAG_LO, _MAG_HI, _MAG_LINEAR = _magnitude_table()
# ascending x: negative half by decreasing magnitude, zero, positive half
_X_LO = np.concatenate([-_MAG_HI[::-1], [0.0], _MAG_LO])
_X_HI = np.concatenate([-_MAG_LO[::-1], [0.0], _MAG_HI])
_X_LINEAR = np.concatenate([_MAG_LINEAR[::-1], [True], _MAG_LINEAR])
# |x|: zero, then both halves added
_A_LO, _A_HI = np.concatenate([[0.0], _MAG_LO]), np.concatenate([[0.0], _MAG_HI])
_A_LINEAR = np.concatenate([[True], _MAG_LINEAR])
# thresholds t with an exact count of |x| < t: 0, then every finite upper edge; _EDGE_POS[i] indexes the
# zero-padded cumulative |x| counts
_EDGES = np.concatenate([[0.0], _MAG_HI[:-1]])
_EDGE_POS = np.concatenate([[0], np.arange(2, len(_MAG_HI) + 1)])


def _position_tables():
    """Per slot, its position in the ascending x order (_X_* tables) and in the |x| order (_A_*); the zero
    slots (and the slots no value reaches) go to the zero bucket."""
    w = len(_MAG_SLOTS)
    mag = np.full(_H, -1)
    mag[_MAG_SLOTS] = np.arange(w)
    nonzero = mag >= 0
    pos_x = np.full(layout.FLOAT_SLOTS, w)
    pos_x[:_H][nonzero], pos_x[_H:][nonzero] = w + 1 + mag[nonzero], w - 1 - mag[nonzero]
    pos_a = np.zeros(layout.FLOAT_SLOTS, dtype=np.int64)
    pos_a[:_H][nonzero] = pos_a[_H:][nonzero] = 1 + mag[nonzero]
    return pos_x, pos_a


_POS_X, _POS_A = _position_tables()


class Prepared:
    """Counts checked once, as int64 [rows, FLOAT_SLOTS], with their leading shape and the slots some row
    occupies (found once): prepare(counts) for several derivations of the same rows (a flush); every function
    here takes one in place of counts."""

    def __init__(self, counts):
        self.c, self.lead = _check(counts)
        self.cols = _occupied_slots(self.c)
        self.orders = {}  # absolute -> _ordered(): the quantiles, abs_below and abs_max_bound share it


def prepare(counts):
    return counts if isinstance(counts, Prepared) else Prepared(counts)


def _rows(counts):
    """counts as int64 [rows, FLOAT_SLOTS] and the leading shape."""
    if isinstance(counts, Prepared):
        return counts.c, counts.lead
    return _check(counts)


def _check(counts):
    c = np.asarray(counts)
    if c.ndim < 1 or c.shape[-1] != layout.FLOAT_SLOTS:
        raise ValueError(f"counts must have {layout.FLOAT_SLOTS} float buckets in its last dimension, got shape "
                         f"{c.shape}")
    if not np.issubdtype(c.dtype, np.integer):
        raise ValueError(f"counts must be integers (the op's int64 slots), got {c.dtype}")
    if c.size and c.min() < 0:
        raise ValueError("counts must be >= 0: these are not float bucket counts")
    return c.reshape(-1, layout.FLOAT_SLOTS).astype(np.int64, copy=False), c.shape[:-1]


def _per_row(name, v, lead):
    """A number or array broadcast over the leading shape, as float64 [rows]; None: NaN (unknown)."""
    if v is None:
        return np.full(int(np.prod(lead, dtype=np.int64)), np.nan)
    v = np.asarray(v, dtype=np.float64)
    try:
        return np.broadcast_to(v, lead).reshape(-1)
    except ValueError:
        raise ValueError(f"{name} must be a number or broadcast to the counts' leading shape {lead}, got shape "
                         f"{v.shape}") from None


def _half(c, base, out):
    """Write one sign's nonzero slots in magnitude order (_MAG_SLOTS) into out [rows, 2042], by slices."""
    out[:, 0], out[:, 1:-1], out[:, -1] = c[:, base + _BELOW], c[:, base:base + _FINITE], c[:, base + _ABOVE]


def _occupied_slots(c):
    """The slots some row counts in (counts are >= 0: a max is the fastest reduction over them)."""
    return np.flatnonzero(c.max(axis=0, initial=0) > 0)


def _ordered(p, absolute):
    """The counts of a Prepared in ascending order of x (or of |x|) at the positions some row occupies, and the
    tables at those positions: (ordered [rows, k], positions [k] into the full order, (lower, upper, linear)
    [k]). Rows use a few dozen of the 4096 slots: the work is on those."""
    if absolute not in p.orders:
        p.orders[absolute] = _order(p, absolute)
    return p.orders[absolute]


def _order(p, absolute):
    pos_table, tables = (_POS_A, (_A_LO, _A_HI, _A_LINEAR)) if absolute else (_POS_X, (_X_LO, _X_HI, _X_LINEAR))
    c, cols = p.c, p.cols
    if cols.size == 0:
        cols = np.array([_ZERO])
    pos = pos_table[cols]
    order = np.argsort(pos, kind="stable")
    keep, start = np.unique(pos[order], return_index=True)
    ordered = np.add.reduceat(c[:, cols[order]], start, axis=1) if c.shape[0] else np.zeros((0, len(keep)),
                                                                                             dtype=np.int64)
    return ordered, keep, tuple(t[keep] for t in tables)


def _absolute(c):
    out = np.empty((c.shape[0], len(_MAG_SLOTS) + 1), dtype=np.int64)
    out[:, 0] = c[:, _ZERO] + c[:, _H + _ZERO]
    _half(c, 0, out[:, 1:])
    neg = np.empty_like(out[:, 1:])
    _half(c, _H, neg)
    out[:, 1:] += neg
    return out


def _find(cum, v):
    """Per row i, the first j with cum[i, j] > v[i, :] (cum nondecreasing, >= 0): one searchsorted over all rows,
    each row lifted above the previous one (in chunks that keep the lifted values within int64)."""
    rows, width = cum.shape
    span = int(cum[:, -1].max(initial=0)) + 1
    step = max(1, (1 << 62) // span)
    out = np.empty(v.shape, dtype=np.int64)
    for s in range(0, rows, step):
        local = np.arange(min(step, rows - s), dtype=np.int64)[:, None]
        flat = (cum[s:s + step] + local * span).ravel()
        j = np.searchsorted(flat, (v[s:s + step] + local * span).ravel(), side="right").reshape(len(local), -1)
        out[s:s + step] = j - local * width
    return np.minimum(out, width - 1)


def _before(ordered):
    """Counts before each bucket [rows, buckets + 1] (zero-padded cumulative counts; the last column is n)."""
    out = np.empty((ordered.shape[0], ordered.shape[1] + 1), dtype=np.int64)
    out[:, 0] = 0
    np.cumsum(ordered, axis=1, out=out[:, 1:])
    return out


def _rank_buckets(before, q):
    """0-based rank (numpy's inverted_cdf) and the bucket holding it, [rows, len(q)]; n [rows]."""
    n = before[:, -1]
    idx = np.maximum(np.ceil(n[:, None] * q[None, :] - 1), 0).astype(np.int64)
    return idx, _find(before[:, 1:], idx), n


def _check_q(q):
    q = np.atleast_1d(np.asarray(q, dtype=np.float64))
    if q.ndim != 1 or not np.all((q >= 0) & (q <= 1)):
        raise ValueError(f"q must be quantiles in [0, 1] (a number or a 1-D sequence), got {q}")
    return q


def _narrowed(j, lo_table, hi_table, known_lo, known_hi):
    """The buckets' [lo, hi] narrowed to the known bounds (NaN: unknown); an infinite end becomes the other end."""
    lo = np.fmax(lo_table[j], known_lo[:, None])
    hi = np.fmin(hi_table[j], known_hi[:, None])
    return np.where(np.isinf(lo), hi, lo), np.where(np.isinf(hi), lo, hi)


def _estimate(ordered, q, tables, known_lo, known_hi):
    lo_table, hi_table, linear = tables
    before = _before(ordered)
    idx, j, n = _rank_buckets(before, q)
    a, b = _narrowed(j, lo_table, hi_table, known_lo, known_hi)
    rows = np.arange(ordered.shape[0])[:, None]
    # the rank's place among its bucket's values, each value at the centre of its own equal share of the bucket
    frac = (idx - before[rows, j] + 0.5) / np.maximum(ordered[rows, j], 1)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        geometric = a * np.power(b / a, frac)  # log-linear: a bucket spans a fixed ratio b / a <= 9/8
        est = np.where(linear[j] | (a == b) | ~(a * b > 0), a + frac * (b - a), geometric)
    est = np.where((idx == 0) & ~np.isnan(known_lo)[:, None], known_lo[:, None], est)
    est = np.where((idx == n[:, None] - 1) & ~np.isnan(known_hi)[:, None], known_hi[:, None], est)
    return np.where(n[:, None] > 0, est, np.nan)


def quantiles(counts, q=DEFAULT_QUANTILES, *, absolute=False, minimum=None, maximum=None):
    """Quantiles [..., len(q)] of x (absolute=False) or of |x|, error bound in the module docstring. minimum /
    maximum: the exact min and max of the finite x (the state's fstate MIN/MAX, NaN while empty), optional,
    broadcast over the leading dimensions; they narrow the end buckets and make the extreme ranks exact."""
    p = prepare(counts)
    lead = p.lead
    q = _check_q(q)
    lo, hi = _per_row("minimum", minimum, lead), _per_row("maximum", maximum, lead)
    ordered, _, tables = _ordered(p, absolute)
    if absolute:
        with np.errstate(invalid="ignore"):
            known_lo = np.where(lo > 0, lo, np.where(hi < 0, -hi, np.nan))
        est = _estimate(ordered, q, tables, known_lo, np.fmax(np.abs(lo), np.abs(hi)))
    else:
        est = _estimate(ordered, q, tables, lo, hi)
    return est.reshape(*lead, len(q))


def log2_hist(counts):
    """The log2 |x| histogram [..., LOG_SLOTS] (layout.py): the sum of each binade's sub-buckets over both signs.
    slot 0 exact zeros, 1 nonzero |x| < 2**-126 (float64 ones below 2**-149 too), 2 + k: [2**(k-126),
    2**(k-125)), float64 >= 2**128 in the last slot. Equal to the kernels' log2 histogram for float32, float16 and
    bfloat16 inputs; a float64 value is binned by its exact magnitude, where the kernels round it to float32 first
    (a value just below a power of two may round up into the next slot there)."""
    p = prepare(counts)
    c, lead, cols = p.c, p.lead, p.cols
    out = np.zeros((c.shape[0], layout.LOG_SLOTS), dtype=np.int64)
    if cols.size and c.shape[0]:  # the occupied slots only, added per log2 slot
        log2 = _LOG2_OF_SLOT[cols]
        order = np.argsort(log2, kind="stable")
        slots, start = np.unique(log2[order], return_index=True)
        out[:, slots] = np.add.reduceat(c[:, cols[order]], start, axis=1)
    return out.reshape(*lead, layout.LOG_SLOTS)


def _log2_of_slot():
    """Per float bucket, its log2 slot (log2_hist's docstring); the slots no value reaches go to slot 0 with the
    zeros (they hold nothing)."""
    k = np.arange(_H)
    half = np.where(k < _SUB, 1, 2 + (k - _SUB) // _SUB)
    half = np.where(k >= _FINITE, 0, half)
    half[_BELOW], half[_ABOVE] = 1, layout.LOG_SLOTS - 1
    return np.concatenate([half, half])


_LOG2_OF_SLOT = _log2_of_slot()


def _below_counts(c):
    """_before of the |x| buckets [rows, 1 + 2043]: entry _EDGE_POS[i] counts |x| < _EDGES[i], entry 1 counts
    the exact zeros."""
    return _before(_absolute(c))


def _share(num, n):
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, num / np.maximum(n, 1), np.nan)


def near_zero(counts, threshold):
    """Exact share [...] of the finite values with |x| < threshold; threshold (a number or an array broadcast
    over the leading dimensions) must be a bucket edge: 0, 2**-149, any power of two in [2**-129, 2**128], or
    (1 + m/8) * 2**e."""
    c, lead = _rows(counts)
    t = _per_row("threshold", threshold, lead)
    i = np.minimum(np.searchsorted(_EDGES, t), len(_EDGES) - 1)
    bad = _EDGES[i] != t
    if bad.any():
        raise ValueError(f"threshold {t[bad][0]!r} is not a bucket edge: use 0, 2**-149 or a power of two in "
                         f"[2**-129, 2**128] (edges: 2**-149, k * 2**-129 for k = 1..7, (1 + m/8) * 2**e)")
    below = _below_counts(c)
    rows = np.arange(c.shape[0])
    return _share(below[rows, _EDGE_POS[i]], below[:, -1]).reshape(lead)


def relative_near_zero(counts, below_log2=NEAR_ZERO_BELOW_LOG2, q=NEAR_ZERO_SCALE_Q):
    """The default near-zero figure (rule and why: module docstring): {"share": exact share of |x| < threshold,
    "threshold": 2**(E - below_log2), E = floor(log2) of the q-quantile of |x| (0.0: exact zeros only)}, [...].
    Below float32's normals E is that of the bucket's lower edge and the threshold the largest edge under
    2**(E - below_log2); float64 scales >= 2**128 count as E = 128."""
    p = prepare(counts)
    c, lead = p.c, p.lead
    ordered, keep, (a_lo, _, _) = _ordered(p, True)
    below = _before(ordered)
    _, j, n = _rank_buckets(below, _check_q(q)[:1])
    scale = a_lo[j[:, 0]]
    _, e = np.frexp(scale)  # scale in [2**(e-1), 2**e): E = e - 1
    target = np.ldexp(1.0, e - 1 - int(below_log2))
    i = np.searchsorted(_EDGES, target, side="right") - 1
    pos = np.where(scale > 0, np.maximum(_EDGE_POS[i], 1), 1)  # in the full order: |x| below it count
    share = _share(below[np.arange(c.shape[0]), np.searchsorted(keep, pos)], n)
    threshold = np.where(pos > 1, _EDGES[i], 0.0)
    return {"share": share.reshape(lead), "threshold": np.where(n > 0, threshold, np.nan).reshape(lead)}


def _edge_pos(t, side):
    """Position (in _below_counts) of the largest edge <= t (side "floor") or the smallest >= t ("ceil")."""
    i = np.searchsorted(_EDGES, t, side="right") - 1 if side == "floor" else np.searchsorted(_EDGES, t)
    return _EDGE_POS[i]


EXACT_SHARES = {name: {"underflow": sub in _EDGES, "subnormal": sub in _EDGES and normal in _EDGES,
                       "overflow": mx in _EDGES} for name, (sub, normal, mx) in FORMATS.items()}


def dtype_shares(counts):
    """Per format of FORMATS: shares [...] of the finite values (zeros included, as plots.range_shares) that
    it cannot hold. underflow: nonzero |x| below its smallest subnormal (rounds to 0 or to that subnormal);
    subnormal: |x| in [smallest subnormal, smallest normal) (precision lost); overflow: |x| >= its max (clipped
    by a saturating cast, or beyond). Each as a lower bound (key) and an upper bound (key + "_upper"), equal
    where the bound is a bucket edge (EXACT_SHARES): fp8 e4m3 and e5m2 all exact, fp16's underflow and
    subnormal exact, its overflow within [|x| >= 2**16, |x| >= 61440]; bf16's smallest subnormal 2**-133 and
    max (2 - 2**-7) * 2**127 are inside buckets (underflow within [float64 below 2**-149, |x| < 2**-129])."""
    c, lead = _rows(counts)
    below = _below_counts(c)
    n, zeros = below[:, -1], below[:, 1]
    out = {}
    for name, (sub, normal, mx) in FORMATS.items():
        f = {side: [below[:, _edge_pos(t, side)] for t in (sub, normal, mx)] for side in ("floor", "ceil")}
        counts_lo = {"underflow": f["floor"][0] - zeros, "subnormal": np.maximum(f["floor"][1] - f["ceil"][0], 0),
                     "overflow": n - f["ceil"][2]}
        counts_hi = {"underflow": f["ceil"][0] - zeros, "subnormal": f["ceil"][1] - f["floor"][0],
                     "overflow": n - f["floor"][2]}
        out[name] = {**{k: _share(v, n).reshape(lead) for k, v in counts_lo.items()},
                     **{k + "_upper": _share(v, n).reshape(lead) for k, v in counts_hi.items()}}
    return out


def _view_range(before, x_lo, x_hi, known_lo, known_hi, q):
    """[lo, hi] per row: the buckets holding the q ranks, else the occupied buckets, else +-1/8 around the value."""
    _, j, n = _rank_buckets(before, np.concatenate([q, [0.0, 1.0]]))
    lo, _ = _narrowed(j[:, 0:1], x_lo, x_hi, known_lo, known_hi)
    _, hi = _narrowed(j[:, 1:2], x_lo, x_hi, known_lo, known_hi)
    span_lo, _ = _narrowed(j[:, 2:3], x_lo, x_hi, known_lo, known_hi)
    _, span_hi = _narrowed(j[:, 3:4], x_lo, x_hi, known_lo, known_hi)
    flat = ~(hi > lo)
    lo, hi = np.where(flat, span_lo, lo)[:, 0], np.where(flat, span_hi, hi)[:, 0]
    w = np.where(lo == 0, 1.0, np.abs(lo) / 8)
    flat = ~(hi > lo)
    lo, hi = np.where(flat, lo - w, lo), np.where(flat, hi + w, hi)
    empty = n == 0
    return np.where(empty, -1.0, lo), np.where(empty, 1.0, hi)


def linear_view(counts, nbins=64, *, q=(0.001, 0.999), minimum=None, maximum=None, span=None):
    """A linear histogram fitted to the occupied span (rules: module docstring), for TensorBoard's
    add_histogram_raw, W&B, the charts and fastai's color_dim. span=(lo, hi) (numbers or arrays over the leading
    dimensions, lo < hi) fixes the range instead, e.g. one range for all steps of a heatmap. Returns
    {"edges": float64 [..., nbins + 1], "counts": int64 [..., nbins] adding up to n, "below" / "above": int64
    [...] values beyond the edges, counted in the first / last bin}. Empty rows: edges from -1 to 1, zero counts."""
    if isinstance(nbins, bool) or not isinstance(nbins, (int, np.integer)) or nbins < 1:
        raise ValueError(f"nbins must be an integer >= 1, got {nbins!r}")
    q = _check_q(q)
    if len(q) != 2 or not q[0] <= q[1]:
        raise ValueError(f"q must be two quantiles (low, high) with low <= high, got {q}")
    p = prepare(counts)
    c, lead = p.c, p.lead
    known_lo, known_hi = _per_row("minimum", minimum, lead), _per_row("maximum", maximum, lead)
    ordered, _, (x_lo, x_hi, _) = _ordered(p, False)
    before = _before(ordered)
    n = before[:, -1]
    if span is None:
        lo, hi = _view_range(before, x_lo, x_hi, known_lo, known_hi, q)
    else:
        lo, hi = (_per_row(f"span[{i}]", v, lead) for i, v in enumerate(span))
        if not np.all(np.isfinite(lo) & np.isfinite(hi) & (lo < hi)):
            raise ValueError("span must be (lo, hi) with finite lo < hi")
    edges = lo[:, None] + (hi - lo)[:, None] * (np.arange(nbins + 1) / nbins)
    edges[:, -1] = hi
    # mass below each edge, each bucket uniform over its span narrowed to [minimum, maximum]; an edge below
    # every occupied bucket takes the first (none of it lies below the edge)
    k = np.maximum(np.searchsorted(x_lo, edges, side="left") - 1, 0)
    rows = np.arange(c.shape[0])[:, None]
    a = np.fmax(x_lo[k], known_lo[:, None])
    b = np.fmin(x_hi[k], known_hi[:, None])
    a, b = np.where(np.isinf(a), b, a), np.where(np.isinf(b), a, b)
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = np.where(b > a, np.clip((edges - a) / (b - a), 0, 1), edges > a)
    below = np.rint(before[rows, k] + ordered[rows, k] * frac).astype(np.int64)
    cum = np.concatenate([np.zeros((c.shape[0], 1), dtype=np.int64), below[:, 1:-1], n[:, None]], axis=1)
    out = {"edges": edges, "counts": np.diff(cum, axis=1), "below": below[:, 0], "above": n - below[:, -1]}
    return {key: v.reshape(lead + v.shape[1:]) for key, v in out.items()}


def abs_below(counts, thresholds, *, maximum=None):
    """Estimated counts [..., K] of the finite values with |x| < t for each of K thresholds t per row
    (thresholds [..., K], broadcast over the leading dimensions). Exact where t is a bucket edge (the count below
    the bucket holding t); otherwise the bucket's count is taken as spread over it as quantiles() takes it
    (log-linearly, linearly below 2**-126), so the error is below that one bucket's count. maximum: a known
    bound on |x| (NaN: none), narrowing the bucket's span: a t above it counts the whole bucket."""
    p = prepare(counts)
    lead = p.lead
    t = np.asarray(thresholds, dtype=np.float64)
    k = t.shape[-1]
    t = np.broadcast_to(t, lead + (k,)).reshape(p.c.shape[0], k)
    bound = _per_row("maximum", maximum, lead)[:, None]
    ordered, keep, _ = _ordered(p, True)
    before = _before(ordered)
    j = np.clip(np.searchsorted(_A_LO, t, side="right") - 1, 1, len(_A_LO) - 1)  # t > 0 never picks the zeros
    at = np.searchsorted(keep, j)  # the occupied buckets below bucket j: before[:, at] counts them
    inside = np.minimum(at, len(keep) - 1)
    rows = np.arange(p.c.shape[0])[:, None]
    held = np.where(keep[inside] == j, ordered[rows, inside], 0)  # bucket j's count (0 where no row occupies it)
    a, b = _A_LO[j], np.fmin(_A_HI[j], bound)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        frac = np.where(_A_LINEAR[j], (t - a) / (b - a), np.log(t / a) / np.log(b / a))
    frac = np.where(t >= b, 1.0, np.where(t <= a, 0.0, frac))
    est = before[rows, at] + held * frac
    return np.where(t > 0, est, 0.0).reshape(lead + (k,))


def is_edge(t):
    """Whether each t is a bucket edge (abs_below counts |x| < t exactly there)."""
    t = np.asarray(t, dtype=np.float64)
    i = np.minimum(np.searchsorted(_EDGES, t), len(_EDGES) - 1)
    return _EDGES[i] == t


def abs_max_bound(counts):
    """[...]: the upper edge of the highest occupied |x| bucket, a bound on the largest |x| (NaN: empty; 0: only
    zeros; inf: a float64 value >= 2**128)."""
    p = prepare(counts)
    ordered, keep, (_, hi, _) = _ordered(p, True)
    occupied = ordered > 0
    last = occupied.shape[1] - 1 - np.argmax(occupied[:, ::-1], axis=1)
    return np.where(occupied.any(axis=1), hi[last], np.nan).reshape(p.lead)
