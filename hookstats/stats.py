"""Host-side view of the state: finalize() turns raw state arrays into a record of plain values, and
merge_states() combines states (devices, ranks) exactly as the kernels do (Chan's merge, float64)."""
import math

import numpy as np
import torch

from . import layout, statistics


def new_fstate_values():
    return [0.0, 0.0, 0.0, math.nan, math.nan]


def merge_states(states):
    """Merge [(fstate, istate), ...] (NumPy arrays) in the given order; returns one (fstate, istate)."""
    f = np.array(new_fstate_values(), dtype=np.float64)
    i = None
    for fb, ib in states:
        na, ma, m2a = f[: layout.MIN]
        nb, mb, m2b = fb[: layout.MIN]
        if nb > 0:
            if na == 0:
                f[: layout.MIN] = (nb, mb, m2b)
            else:
                n = na + nb
                d = mb - ma
                frac = nb / n
                f[: layout.MIN] = (n, ma + d * frac, m2a + m2b + d * d * na * frac)
        f[layout.MIN] = np.fmin(f[layout.MIN], fb[layout.MIN])
        f[layout.MAX] = np.fmax(f[layout.MAX], fb[layout.MAX])
        i = ib.astype(np.int64).copy() if i is None else i + ib
    return f, i


def chan_merge_rows(a, b):
    """Chan's merge of fstate rows b into a ([..., 5] float64 tensors), in the order of stats.merge_states,
    on the device: min/max by fmin/fmax (NaN = empty), rows with no finite values leave the other untouched."""
    na, ma, m2a = a[..., layout.N_FINITE], a[..., layout.MEAN], a[..., layout.M2]
    nb, mb, m2b = b[..., layout.N_FINITE], b[..., layout.MEAN], b[..., layout.M2]
    n = na + nb
    d = mb - ma
    frac = nb / n.clamp(min=1)
    merged = torch.stack([n, ma + d * frac, m2a + m2b + d * d * na * frac], dim=-1)
    moments = torch.where((nb == 0).unsqueeze(-1), a[..., : layout.MIN],
                          torch.where((na == 0).unsqueeze(-1), b[..., : layout.MIN], merged))
    return torch.cat([moments,
                      torch.fmin(a[..., layout.MIN], b[..., layout.MIN]).unsqueeze(-1),
                      torch.fmax(a[..., layout.MAX], b[..., layout.MAX]).unsqueeze(-1)], dim=-1)


def finalize(fstate, istate, cfg):
    """One target's statistics as plain Python/NumPy values (finalize_rows of one state). std is the unbiased
    (n - 1) one, like torch.std; histograms are None when switched off in the config."""
    cols = finalize_rows(fstate, istate, cfg)
    return {k: None if v is None else v.item() if v.ndim == 0 else v.copy() for k, v in cols.items()}


def finalize_rows(fstate, istate, cfg):
    """The statistics of many states at once (the rows of hookstats.statistics.TABLE that stats() records
    have): fstate [..., 5] float64 and istate [..., istate_size] int64 give arrays over the leading
    dimensions (histograms with one more dimension, hist_edges one array); None for a histogram switched off."""
    f = np.asarray(fstate, dtype=np.float64)
    i = np.asarray(istate, dtype=np.int64)
    with np.errstate(divide="ignore", invalid="ignore"):  # the rows where a statistic is NaN instead
        return statistics.derive_rows(f, i, cfg, statistics.STATS)
