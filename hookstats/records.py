"""The records every readout hands out, built in one place: stats() and reduce()'s Reduced.stats() (running
totals, one record per target id) and the history's per-step records and columns (what sinks get)."""
import numpy as np

from . import statistics
from .stats import finalize_rows

KEY_FIELDS = ("target", "module", "kind", "leaf")  # what a history record says of its target, first


def key_fields(key):
    """The KEY_FIELDS of a TargetKey, as history records and MemorySink.write_rows take them."""
    return {"target": key.id, "module": key.module, "kind": key.kind, "leaf": key.leaf}


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
        out[key.id] = {"module": key.module, "kind": key.kind, "leaf": key.leaf, "call": key.call, "phase": phase,
                       **_row(cols, (r,))}
    return out


def step_columns(fstate, istate, cfg):
    """The statistics of every step slot and target ([S, T] arrays, histograms [S, T, size]) in the keys and
    order of a history record (statistics.TABLE, scope HISTORY: min/max as running values)."""
    f = np.asarray(fstate, dtype=np.float64)
    i = np.asarray(istate, dtype=np.int64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return statistics.derive_rows(f, i, cfg, statistics.HISTORY)


def select_steps(cols, slots):
    """step_columns() of the step slots `slots` only (an index array)."""
    return {k: v if v is None or statistics.BY_NAME[k].type == statistics.EDGES else v[slots] for k, v in cols.items()}


def step_records(keys, cols, present):
    """Per step slot, the records (dicts) of the targets present, from step_columns()."""
    lists = {k: v.tolist() for k, v in cols.items() if v is not None and v.ndim == 2}
    for s, row in enumerate(present.tolist()):
        yield [{**key_fields(keys[t]), **_row(cols, (s, t), lists)} for t, here in enumerate(row) if here]


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
            rec[k] = x.copy() if x.ndim else x.item()
    return rec
