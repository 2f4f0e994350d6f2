"""The table of statistics: per statistic its name, how it is derived from the state, its type, which
readouts have it and who gets it (sinks, dashboards, alerts, plots). records.finalize_rows, the record builder,
the sinks, the alerts and the plots read this table: a statistic derived from the state is one row.
An array-valued one (a histogram derived from other slots) is a COUNTS row. What several rows share (the
quantiles of the float buckets, derived at once for all of them) is an INTERNAL row, in no record."""
import dataclasses
import math
from typing import Callable, Optional

import numpy as np

from . import buckets, layout, rawstate, whatif
from .tensor_kind import torch_of

INT, FLOAT, COUNTS, EDGES = "int", "float", "counts", "edges"  # COUNTS: int64 array per target; EDGES: one array
STATS, HISTORY, BOTH, SINKS, INTERNAL = "stats", "history", "both", "sinks", "internal"


class Derivation:
    """The context a derive function reads: the states' raw fields (fstate [..., F], istate [..., istate_size];
    NumPy on the host, torch on the device for the alerts; field(name) by hookstats/rawstate.py's table), their
    StatsConfig `cfg`, and s[name], another statistic of the table (derived once). The helpers work on both;
    divisions are float64."""

    def __init__(self, fstate, istate, cfg, scope=None, amax_before=None):
        self.f, self.i, self.cfg, self.nbins, self.flags, self.scope = fstate, istate, cfg, cfg.nbins, cfg.flags, scope
        self.amax_before = amax_before  # delayed scaling's amax per row (NaN: no step before), None: no history
        self._torch = torch_of(fstate)  # the torch module for tensors, None for NumPy arrays
        self._done = {}

    def __getitem__(self, name):
        if name not in self._done:
            self._done[name] = BY_NAME[name].derive(self)
        return self._done[name]

    def field(self, name):
        """Raw field `name` of rawstate.FIELDS: one column for a one-slot fstate field, else its istate slots."""
        fd = rawstate.BY_NAME[name]
        start, size = fd.slots(self.nbins, self.flags)
        if fd.part == rawstate.FSTATE:
            return self.f[..., start]
        return self.i[..., start: start + size]

    def fcol(self, c):
        return self.f[..., c]

    def icol(self, c):
        return self.i[..., c]

    def lin(self, lo, hi=None):
        """Slots lo..hi-1 of the linear histogram (0 under, 1..nbins, nbins + 1 over; hi None: one slot, no
        trailing dimension). Only with the linear bins (layout.LINEAR_HIST)."""
        base = layout.LIN_BASE
        return self.i[..., base + lo] if hi is None else self.i[..., base + lo: base + hi]

    def nonfinite(self, k):
        """The NaN (k=0), +Inf (1) or -Inf (2) count."""
        return self.i[..., layout.nonfinite_base(self.nbins, self.flags) + k]

    def log2(self):
        return self.i[..., layout.log_base(self.nbins, self.flags): layout.float_base(self.nbins, self.flags)]

    def floats(self):
        base = layout.float_base(self.nbins, self.flags)
        return self.i[..., base: base + layout.FLOAT_SLOTS]

    def exact_range(self):
        """(min, max) that bound these rows' values exactly: stats() records' own (NaN while empty); None, None
        for the history's per-step rows, whose min/max are running values (a step's own are not kept)."""
        if self.scope != STATS:
            return None, None
        return self.fcol(layout.MIN), self.fcol(layout.MAX)

    def where(self, cond, a, b):
        return self._torch.where(cond, a, b) if self._torch else np.where(cond, a, b)

    def div(self, a, b):
        """a / b in float64 (0 / 0: NaN)."""
        return a.double() / b.double() if self._torch else a / b

    def sqrt(self, a):
        return a.sqrt() if self._torch else np.sqrt(a)

    def as_float(self, a):
        return a.double() if self._torch else a.astype(np.float64)

    def as_int(self, a):
        return a.long() if self._torch else a.astype(np.int64)

    def isnan(self, a):
        return a.isnan() if self._torch else np.isnan(a)

    def isinf(self, a):
        return a.isinf() if self._torch else np.isinf(a)

    def hypot(self, a, b):
        """sqrt(a^2 + b^2) without overflow on the way."""
        return self._torch.hypot(a.double(), b.double()) if self._torch else np.hypot(a, b)


@dataclasses.dataclass(frozen=True)
class Plot:
    """How plots.plot_layer_stats draws a statistic: panel title, scale of the values, log y-axis when
    every value is positive, fixed y-limits."""
    label: str
    scale: float = 1.0
    log: bool = False
    ylim: Optional[tuple] = None
    instead_of: Optional[str] = None  # drawn in that statistic's panel, when the records have it


@dataclasses.dataclass(frozen=True)
class Statistic:
    """name; derive(s) -> values (s: a Derivation) over the leading dimensions (COUNTS: one more dimension; EDGES: one
    array from the config); type INT/FLOAT/COUNTS/EDGES; scope: STATS (stats(), reduce()),
    HISTORY (per-step records), BOTH, or SINKS (not in records: derived by the sinks from the record's
    `inputs`); scalar: written by the sinks (CSV, JSONL, the MemorySink frame), and a dashboard choice;
    dashboard: "default" (TensorBoard/W&B log it unless told otherwise), "choice" (they may), or None; alerts: the alert rules
    read it on the device; plot: a Plot, or None; needs: a StatsConfig switch (linear_hist, log_hist,
    float_hist), or a tuple of them of which one must be on, without which the statistic is None. Type and
    scope INTERNAL: a value several rows derive from (s[name]), in no record."""
    name: str
    derive: Callable[[Derivation], object]
    type: str
    scope: str = BOTH
    scalar: bool = False
    dashboard: Optional[str] = None
    alerts: bool = False
    plot: Optional[Plot] = None
    needs: object = None
    inputs: tuple = ()

    def present(self, cfg):
        """needs: None, a StatsConfig switch, or a tuple of switches of which one must be on."""
        needs = (self.needs,) if isinstance(self.needs, str) else self.needs or ()
        return not needs or any(getattr(cfg, n) for n in needs)

    def in_records(self, scope):
        return self.scope in (scope, BOTH)


def _m2(s):
    """M2, NaN where it passed float64's range (float64 values spread past ~1e154): var, std, rms and l2 are
    then unknown, not inf (their true values are mostly finite); moments_overflow says so."""
    m2 = s.fcol(layout.M2)
    return s.where(s["moments_overflow"] > 0, math.nan, m2)


def _var(s):
    n = s.fcol(layout.N_FINITE)
    return s.where(n > 1, s.div(s["_m2"], n - 1), math.nan)


def _rms(s):
    """hypot(mean, sqrt(M2 / n)) over the finite values (finite wherever the answer is: mean^2 alone would
    overflow past ~1e154): the root mean square, NaN while there are none."""
    n, m2 = s.fcol(layout.N_FINITE), s["_m2"]
    return s.where((n > 0) & ~s.isnan(m2), s.hypot(s.fcol(layout.MEAN), s.sqrt(s.div(m2, n))), math.nan)


def _l2(s):
    """sqrt(n) * rms: the L2 norm of the finite values (NaN while there are none, as rms and mean)."""
    return s.sqrt(s.as_float(s.fcol(layout.N_FINITE))) * s["rms"]


def _log2(s):
    """The log2 histogram: summed from the float buckets when the config counts them (the kernel's log2 slots
    then stay empty where it skips them), else the kernel's own."""
    if not s.cfg.float_hist:
        return s.log2()
    return _on_occupied(s, lambda c, _: {"h": buckets.log2_hist(c)}, fill=0, dtype=np.int64)["h"]


def _occupied(s):
    """(rows holding float buckets, as a boolean mask over the leading dimensions; their counts [k, slots],
    buckets.prepare()d once for the derivations): only these are read (a step whose buckets the history does
    not carry has none)."""
    c = s.floats()
    has = c.max(axis=-1, initial=0) > 0  # counts are >= 0: the fastest reduction over them
    return has, buckets.prepare(c.reshape(-1, c.shape[-1]) if has.all() else c[has])


def _on_occupied(s, fn, fill=math.nan, dtype=np.float64):
    """fn(counts [k, slots], mask) -> {key: [k, ...]} spread back over the leading dimensions, `fill` elsewhere."""
    has, c = s["_occupied"]
    out = {}
    for key, v in fn(c, has).items():
        full = np.full(has.shape + v.shape[1:], fill, dtype=dtype)
        full[has] = v
        out[key] = full
    return out


def _hist_count(s):
    """Values the record's histograms hold (finite ones: NaN/Inf are not in them): its float buckets' where it has
    them, else its linear bins' (underflow and overflow included), else its log2 slots'. With hist_every > 1
    fewer than `finite`: what is derived from the histograms is a share of these."""
    if s.cfg.float_hist:
        n = s.floats().sum(axis=-1)
    elif s.cfg.linear_hist:
        n = s.lin(0, s.nbins + 2).sum(axis=-1)
    else:
        n = s.log2().sum(axis=-1)
    return s.as_float(n)


def _outer_bin(s, k):
    """Linear slot k (underflow or overflow) as a float, NaN where the bins hold nothing though finite values were
    measured: the record spans no histogram step (hist_every), so how many values fell outside is unknown."""
    unknown = (s.lin(0, s.nbins + 2).sum(axis=-1) == 0) & (s.fcol(layout.N_FINITE) > 0)
    return s.where(unknown, math.nan, s.as_float(s.lin(k)))


def _quantiles(s):
    lo, hi = s.exact_range()
    if lo is not None:  # the exact min/max bound the buckets' values only when the buckets hold every finite value
        whole = s["hist_count"] == s.fcol(layout.N_FINITE)
        lo, hi = s.where(whole, lo, math.nan), s.where(whole, hi, math.nan)

    def both(c, has):
        pick = (lambda v: None) if lo is None else (lambda v: v[has])
        return {absolute: buckets.quantiles(c, QUANTILES, absolute=absolute, minimum=pick(lo), maximum=pick(hi))
                for absolute in (False, True)}
    return _on_occupied(s, both)


def _whatif(s):
    """Every what-if share (hookstats/whatif.py), the three recipes in one pass. Current scaling's amax: a stats()
    record's exact one where its buckets hold every finite value; else the upper edge of the buckets' top bucket,
    within the running max |x| (a history record's buckets may hold several steps), so that it bounds every value
    as the true amax does."""
    lo, hi = s.exact_range()
    running = np.fmax(np.abs(s.fcol(layout.MIN)), np.abs(s.fcol(layout.MAX)))
    if lo is not None:
        whole = s["hist_count"] == s.fcol(layout.N_FINITE)
        running = np.where(whole, running, np.nan)
    before = s.amax_before

    def shares(c, has):
        exact = running[has] if lo is not None else np.full(c.c.shape[0], np.nan)
        amax = np.where(np.isnan(exact), np.fmin(buckets.abs_max_bound(c), running[has]), exact)
        recipes = {"": None, "_current": whatif.scales_for(amax)}
        if before is not None:
            recipes["_delayed"] = whatif.scales_for(np.broadcast_to(before, has.shape)[has], s.cfg.amax_margin)
        out = whatif.shares_of(c, recipes, amax)
        if before is None:
            out.update((k, np.full(len(amax), np.nan)) for k in whatif.field_names(["_delayed"]))
        return out
    return _on_occupied(s, shares)


def _whatif_rows():
    return tuple(Statistic(name, lambda s, name=name: s["_whatif"][name], FLOAT, scalar=True, dashboard="choice",
                           needs="float_hist") for name in whatif.field_names())


# the quantile scalars: pXX of x, abs_pXX of |x| (dots in names would nest in W&B and pandas)
QUANTILES = buckets.DEFAULT_QUANTILES
QUANTILE_NAMES = tuple("p" + f"{100 * q:g}".replace(".", "_") for q in QUANTILES)


def _quantile_rows():
    rows = []
    for prefix, absolute in (("", False), ("abs_", True)):
        for k, name in enumerate(QUANTILE_NAMES):
            rows.append(Statistic(prefix + name, lambda s, absolute=absolute, k=k: s["_quantiles"][absolute][..., k],
                                  FLOAT, scalar=True, dashboard="choice", needs="float_hist"))
    return tuple(rows)


TABLE = (
    Statistic("count", lambda s: s.icol(layout.COUNT), INT, scalar=True),
    Statistic("finite", lambda s: s.as_int(s.fcol(layout.N_FINITE)), INT, scalar=True),
    Statistic("mean", lambda s: s.where(s.fcol(layout.N_FINITE) > 0, s.fcol(layout.MEAN), math.nan), FLOAT,
              scalar=True, dashboard="default", plot=Plot("mean")),
    Statistic("std", lambda s: s.sqrt(s["var"]), FLOAT,  # NaN where var is
              scalar=True, dashboard="default", alerts=True, plot=Plot("std", log=True)),
    Statistic("var", _var, FLOAT),
    Statistic("_m2", _m2, INTERNAL, scope=INTERNAL),
    # of the finite values (NaN/Inf left out, as in mean and var): in a history record, of that step's values
    Statistic("rms", _rms, FLOAT, scalar=True, dashboard="choice"),
    Statistic("l2", _l2, FLOAT, scalar=True, dashboard="choice"),
    Statistic("min", lambda s: s.fcol(layout.MIN), FLOAT, scope=STATS),
    Statistic("max", lambda s: s.fcol(layout.MAX), FLOAT, scope=STATS),
    # near_zero_count <= count: 0 / 0 = NaN while empty
    Statistic("near_zero", lambda s: s.div(s["near_zero_count"], s["count"]), FLOAT, scalar=True, dashboard="default", alerts=True, plot=Plot("near zero (%)", 100, ylim=(-2, 102))),
    Statistic("near_zero_count", lambda s: s.icol(layout.NEAR_ZERO), INT),
    # the default near-zero figure with float buckets: share of |x| < 2**(E - 10), E = floor(log2 p99 |x|)
    # (why: hookstats/buckets.py); the eps one above stays, and is what the alerts read
    Statistic("near_zero_rel", lambda s: s["_near_zero_rel"]["share"], FLOAT, scalar=True, dashboard="default",
              plot=Plot("near zero (%): |x| < 2^-10 of its p99", 100, ylim=(-2, 102), instead_of="near_zero"),
              needs="float_hist"),
    Statistic("near_zero_rel_threshold", lambda s: s["_near_zero_rel"]["threshold"], FLOAT, scalar=True,
              needs="float_hist"),
    Statistic("_occupied", _occupied, INTERNAL, scope=INTERNAL),
    Statistic("_near_zero_rel", lambda s: _on_occupied(s, lambda c, _: buckets.relative_near_zero(c)), INTERNAL,
              scope=INTERNAL),
    Statistic("_quantiles", _quantiles, INTERNAL, scope=INTERNAL),
    *_quantile_rows(),
    # share of the finite values a cast to e4m3/e5m2/fp16/bf16 would lose, unscaled, with current and with delayed
    # scaling (hookstats/whatif.py); delayed is NaN in stats() records (no step: the history's records have it)
    Statistic("_whatif", _whatif, INTERNAL, scope=INTERNAL),
    *_whatif_rows(),
    # what the shares above are of (hist_every); float: NaN where a history record carries no float buckets
    Statistic("hist_count", _hist_count, FLOAT, scalar=True, needs=("float_hist", "linear_hist", "log_hist")),
    Statistic("nan", lambda s: s.nonfinite(0), INT, scalar=True),
    Statistic("posinf", lambda s: s.nonfinite(1), INT, scalar=True),
    Statistic("neginf", lambda s: s.nonfinite(2), INT, scalar=True),
    # 1 where the finite values' sum of squared deviations (M2) passed float64's range: var, std, rms, l2 NaN
    Statistic("moments_overflow", lambda s: s.as_int(s.isinf(s.fcol(layout.M2))), INT, scalar=True),
    # the linear bins' outer slots; float: NaN where the record spans no histogram step (hist_every), not 0
    Statistic("underflow", lambda s: _outer_bin(s, 0), FLOAT, scalar=True, needs="linear_hist"),
    Statistic("overflow", lambda s: _outer_bin(s, s.nbins + 1), FLOAT, scalar=True, needs="linear_hist"),
    Statistic("hist", lambda s: s.lin(1, s.nbins + 1), COUNTS, needs="linear_hist"),
    Statistic("hist_edges", lambda s: s.cfg.edges(), EDGES, needs="linear_hist"),
    Statistic("log2_hist", _log2, COUNTS, needs="log_hist"),  # with float_hist: summed from the buckets
    Statistic("float_hist", lambda s: s.floats(), COUNTS, needs="float_hist"),
    # the history's min/max are running values (since attach or reset()): a step's own minimum is not kept
    Statistic("running_min", lambda s: s.fcol(layout.MIN), FLOAT, scope=HISTORY, scalar=True),
    Statistic("running_max", lambda s: s.where(s.isnan(s.fcol(layout.MIN)), math.nan, s.fcol(layout.MAX)), FLOAT,
              scope=HISTORY, scalar=True),
    # nan + posinf + neginf: one dashboard line that stays at 0 while all is well
    Statistic("nonfinite", lambda s: s["nan"] + s["posinf"] + s["neginf"], INT, scope=SINKS, dashboard="default",
              alerts=True, inputs=("nan", "posinf", "neginf")),
)
BY_NAME = {st.name: st for st in TABLE}

SCALARS = tuple(st.name for st in TABLE if st.scalar)
DASHBOARD_CHOICES = SCALARS + tuple(st.name for st in TABLE if st.dashboard and not st.scalar)
DASHBOARD_STATS = tuple(st.name for st in TABLE if st.dashboard == "default")
PLOTTED = tuple(st for st in TABLE if st.plot is not None)
ALERTED = tuple(st.name for st in TABLE if st.alerts)
# figures of the histograms (needs a histogram switch): NaN on a record whose histograms were not counted (a step
# between histogram steps), which the sinks leave out rather than write
HIST_FIGURES = tuple(st.name for st in TABLE if st.scalar and st.needs is not None)


def names(scope, of_type=None):
    """The statistics of a record of `scope` (STATS or HISTORY), in record order, optionally of one type."""
    return tuple(st.name for st in TABLE if st.in_records(scope) and (of_type is None or st.type == of_type))


def derive_rows(fstate, istate, cfg, scope, amax_before=None):
    """{name: values} of every statistic of `scope`'s records (see Statistic), None where switched off.
    amax_before: the delayed-scaling amax per row (hookstats/amax_window.py), None where there is no history."""
    rows = Derivation(fstate, istate, cfg, scope, amax_before)
    return {st.name: rows[st.name] if st.present(cfg) else None for st in TABLE if st.in_records(scope)}


def derive(wanted, fstate, istate, cfg):
    """{name: values} of the `wanted` statistics from raw state rows (NumPy, or torch: the alerts' device
    path)."""
    rows = Derivation(fstate, istate, cfg)
    return {n: rows[n] for n in wanted}


def from_record(name, record):
    """A SINKS statistic from a record's values (None when one of its inputs is missing or None)."""
    st = BY_NAME[name]
    values = {k: record.get(k) for k in st.inputs}
    if any(v is None for v in values.values()):
        return None
    return st.derive(values)  # a SINKS statistic's derive reads only s[input]: a dict serves
