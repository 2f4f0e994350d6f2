"""Both histograms of a record as NumPy-style (edges, counts), the form TensorBoard's add_histogram_raw
(upper edges) and wandb.Histogram(np_histogram=...) take; shared by the sinks and the framework callbacks.
The value histogram is the exact linear one where the user configured it (lo/hi/nbins), else a linear view
fitted to each record's float buckets (buckets.linear_view: from its p0.1 to its p99.9), all records of a
write at once."""
import math

import numpy as np

from .. import buckets, layout

VIEW_BINS = 64  # bins of the fitted view on the dashboards

_LOG2_EDGES = np.arange(layout.LOG_EXP_MIN - 1, layout.LOG_EXP_MIN + layout.LOG_SLOTS - 1, dtype=np.float64)


def value_range(rec):
    """(min, max) of the finite values: running ones in history records, the window's in stats() records."""
    return rec.get("running_min", rec.get("min", math.nan)), rec.get("running_max", rec.get("max", math.nan))


def linear_buckets(rec):
    """(edges, counts) of the linear histogram with underflow and overflow as the outer buckets, which reach
    down to the minimum and up to the maximum (one bin width past the range when those are inside it);
    None when the record has no linear histogram, no finite value, or bins that counted none of them (hist_every)."""
    # underflow is NaN (None once through JSON) where the record spans no histogram step (hist_every): no
    # histogram, not an empty one
    under = rec.get("underflow")
    if rec.get("hist") is None or not rec.get("finite") or under is None or math.isnan(under):
        return None
    edges = np.asarray(rec["hist_edges"], dtype=np.float64)
    width = edges[1] - edges[0]
    lo, hi = value_range(rec)
    bottom = lo if math.isfinite(lo) and lo < edges[0] else edges[0] - width
    top = hi if math.isfinite(hi) and hi > edges[-1] else edges[-1] + width
    counts = np.concatenate([[rec["underflow"]], rec["hist"], [rec["overflow"]]]).astype(np.float64)
    return np.concatenate([[bottom], edges, [top]]), counts


def value_histograms(records):
    """Per record, the (edges, counts) of its value histogram (module docstring), or None without one."""
    out = [linear_buckets(rec) for rec in records]
    # a record whose buckets counted nothing has no histogram, not an empty one
    fit = [k for k, rec in enumerate(records) if out[k] is None and rec.get("float_hist") is not None
           and rec.get("finite") and np.any(rec["float_hist"])]
    if fit:
        ranges = np.array([value_range(records[k]) for k in fit], dtype=np.float64)
        view = buckets.linear_view(np.stack([records[k]["float_hist"] for k in fit]), VIEW_BINS,
                                   minimum=ranges[:, 0], maximum=ranges[:, 1])
        for row, k in enumerate(fit):
            out[k] = view["edges"][row], view["counts"][row].astype(np.float64)
    return out


def log2_buckets(rec):
    """(edges, counts) over log2 |x| of the nonzero finite values, trimmed to the occupied slots: slot 1
    (nonzero below 2**-126) spans [-127, -126), slot 2+k spans [k-126, k-125); exact zeros are left out.
    None when the record has no log2 histogram or no nonzero finite value."""
    if rec.get("log2_hist") is None:
        return None
    counts = np.asarray(rec["log2_hist"][1:], dtype=np.float64)
    nz = np.flatnonzero(counts)
    if nz.size == 0:
        return None
    lo, hi = nz[0], nz[-1] + 1
    return _LOG2_EDGES[lo: hi + 1], counts[lo:hi]
