"""The records every readout hands out, built in one place from raw states (hookstats/rawstate.py) by the table of
statistics: finalize() of one state, stats() and reduce()'s Reduced.stats() (running totals, one record per target
id) and the history's per-step records and columns (what sinks get)."""
import dataclasses
import functools

import numpy as np

from . import buckets, layout, rawstate, statistics
from .phases import Phase
from .record_reading import KEY_FIELDS, has_buckets, last_records, record, value  # noqa: F401 (hookstats.records' names)

# mon.histogram(): the running histograms of one target (linear: edges, counts, under/overflow; log2; float buckets)
HISTOGRAM_FIELDS = ("hist", "hist_edges", "underflow", "overflow", "log2_hist", "float_hist", "nan", "posinf", "neginf")


def finalize(fstate, istate, cfg):
    """One target's statistics as plain Python/NumPy values (finalize_rows of one state). std is the unbiased
    (n - 1) one, like torch.std; histograms are None when switched off in the config."""
    cols = finalize_rows(fstate, istate, cfg)
    return {k: None if v is None else v.item() if v.ndim == 0 else v.copy() for k, v in cols.items()}


def finalize_rows(fstate, istate, cfg):
    """The statistics of many states at once (the rows of hookstats.statistics.TABLE that stats() records
    have): fstate [..., F] float64 and istate [..., istate_size] int64 give arrays over the leading
    dimensions (histograms with one more dimension, hist_edges one array); None for a histogram switched off."""
    f = np.asarray(fstate, dtype=np.float64)
    i = np.asarray(istate, dtype=np.int64)
    with np.errstate(divide="ignore", invalid="ignore"):  # the rows where a statistic is NaN instead
        return statistics.derive_rows(f, i, cfg, statistics.STATS)


def key_fields(key, phase=Phase.TRAIN):
    """The KEY_FIELDS of a TargetKey in `phase`, as history records and sinks.Steps carry them."""
    return {"target": key.id, "module": key.module, "kind": key.kind, "leaf": key.leaf, "phase": str(phase)}


def stats_records(keyed, cfg, phase):
    """{target id: record} of running totals. keyed: [(TargetKey, fstate, istate)] host arrays, one per target,
    in the order the records go. A target holding a tuple (or dict) gets one state per leaf ("fc:output[0]")
    besides the plain-tensor one preallocated before its first call: that one is left out while empty."""
    if not keyed:
        return {}
    keys = [k for k, _, _ in keyed]
    cols = finalize_rows(np.stack([f for _, f, _ in keyed]), np.stack([i for _, _, i in keyed]), cfg)
    counts = cols["count"].tolist()
    leafy = {(k.module, k.kind) for k in keys if k.leaf}
    out = {}
    for r, key in enumerate(keys):
        if counts[r] == 0 and not key.leaf and (key.module, key.kind) in leafy:
            continue
        out[key.id] = {"module": key.module, "kind": key.kind, "leaf": key.leaf, "call": key.call, "phase": str(phase),
                       **_row(cols, (r,))}
    return out


def step_columns(fstate, istate, cfg):
    """The statistics of every step slot and target ([S, T] arrays, histograms [S, T, size]) in the keys and
    order of a history record (statistics.TABLE, scope HISTORY: min/max as running values), from the
    compact counts a history ring keeps per step (istate's slots before the float buckets, or a whole istate):
    the statistics of the float buckets are None here (no_bucket_columns / bucket_columns add them)."""
    f = np.asarray(fstate, dtype=np.float64)
    i = _compact(istate, cfg)
    with np.errstate(divide="ignore", invalid="ignore"):
        return statistics.derive_rows(f, i, _without_buckets(cfg), statistics.HISTORY)


def no_bucket_columns(cols, slots, cfg):
    """step_columns() of the step slots `slots` (a range), with the statistics of the float buckets (when cfg
    counts them) as steps without buckets have them: NaN scalars, and histograms as read-only zero-stride rows
    (no memory), which records hand out as None. With buckets the log2 histogram is theirs too."""
    n = len(slots)
    cols = select_steps(cols, slice(slots.start, slots.stop))
    for name, (dtype, shape) in _bucket_fields(cfg).items():
        t = cols["count"].shape[1]
        cols[name] = np.full((n, t), np.nan) if not shape else np.broadcast_to(np.zeros(shape, dtype), (n, t, *shape))
    return cols


def bucket_columns(fstate, istate, buckets, cfg, amax_before=None):
    """The columns of one step slot ([1, T] arrays): fstate [T, F] and the compact counts istate [T, ...] of
    step_columns(), and buckets [T, FLOAT_SLOTS], the float buckets this step counted, or None: none;
    amax_before [T]: delayed scaling's amax (NaN: no step before; None: not known, its shares NaN)."""
    f = np.asarray(fstate, dtype=np.float64)[None]
    if not cfg.float_hist or buckets is None:
        return no_bucket_columns(step_columns(f, np.asarray(istate)[None], cfg), range(1), cfg)
    return bucket_rows(f, np.asarray(istate)[None], np.asarray(buckets)[None], cfg,
                       None if amax_before is None else np.asarray(amax_before)[None])


def bucket_rows(fstate, istate, buckets, cfg, amax_before=None):
    """The columns of J step slots that counted float buckets, derived at once ([J, T] arrays): fstate [J, T, F],
    the compact counts istate [J, T, ...] of step_columns(), buckets [J, T, FLOAT_SLOTS] each slot's own float
    buckets; amax_before [J, T] as bucket_columns() takes it."""
    i = np.concatenate([_compact(istate, cfg), np.asarray(buckets, dtype=np.int64)], axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return statistics.derive_rows(np.asarray(fstate, dtype=np.float64), i, cfg, statistics.HISTORY,
                                      None if amax_before is None else np.asarray(amax_before, np.float64))


def _compact(istate, cfg):
    """istate's slots before the float buckets: the istate layout of _without_buckets(cfg)."""
    return np.asarray(istate, dtype=np.int64)[..., : layout.float_base(cfg.nbins, cfg.flags)]


@functools.lru_cache(maxsize=None)
def _without_buckets(cfg):
    """cfg without the float buckets, and without the log2 histogram they give (the op keeps no log2 slots
    beside them), so its istate is cfg's compact counts."""
    return dataclasses.replace(cfg, float_hist=False, log_hist=False) if cfg.float_hist else cfg


@functools.lru_cache(maxsize=None)
def _bucket_fields(cfg):
    """{name: (dtype, shape of one value)} of the history statistics that come from the float buckets (with
    cfg.float_hist; the log2 histogram among them), in record order; {} without."""
    if not cfg.float_hist:
        return {}
    with np.errstate(divide="ignore", invalid="ignore"):
        full = statistics.derive_rows(*rawstate.empty(cfg.istate_size, (1, 1), numpy=True), cfg, statistics.HISTORY)
        plain = statistics.derive_rows(*rawstate.empty(_without_buckets(cfg).istate_size, (1, 1), numpy=True),
                                       _without_buckets(cfg), statistics.HISTORY)
    return {k: (v.dtype, v.shape[2:]) for k, v in full.items()
            if v is not None and statistics.BY_NAME[k].type != statistics.EDGES
            and (plain[k] is None or k in ("log2_hist", "hist_count"))}


def no_hist_columns(cols, cfg):
    """Columns of steps that counted no histograms (hist_every): the histograms the ring keeps per step (the linear
    bins, the kernel's log2 slots) as steps without them have them (None in records); hist_count says 0 (underflow
    and overflow are NaN there by their own rule, statistics._outer_bin)."""
    cols = dict(cols)
    for name in ("hist",) + (() if cfg.float_hist else ("log2_hist",)):
        if cols.get(name) is not None:
            cols[name] = np.broadcast_to(np.zeros((), cols[name].dtype), cols[name].shape)
    return cols


def select_steps(cols, slots):
    """step_columns() of the step slots `slots` only (an index array)."""
    return {k: v if v is None or statistics.BY_NAME[k].type == statistics.EDGES else v[slots] for k, v in cols.items()}


def step_records(keys, cols, present, phase=Phase.TRAIN):
    """Per step slot, the records (dicts) of the targets present, from step_columns()."""
    lists = {k: v.tolist() for k, v in cols.items() if v is not None and v.ndim == 2}
    for s, row in enumerate(present.tolist()):
        yield [{**key_fields(keys[t], phase), **_row(cols, (s, t), lists)} for t, here in enumerate(row) if here]


def _row(cols, at, lists=None):
    """One record's statistics from columns: scalars as Python values, each array its own copy."""
    rec = {}
    for k, v in cols.items():
        if v is None:
            rec[k] = None
        elif statistics.BY_NAME[k].type == statistics.EDGES:
            rec[k] = v.copy()
        elif lists is not None and k in lists:
            rec[k] = lists[k][at[0]][at[1]]
        else:
            x = v[at]
            none = x.ndim and not x.flags.writeable and not x.any()  # a step without buckets (no_bucket_columns)
            rec[k] = None if none else x.copy() if x.ndim else x.item()
    return rec
