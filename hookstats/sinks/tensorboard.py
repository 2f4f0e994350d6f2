"""TensorBoardSink: scalars per target and statistic and histograms rebuilt from our bins with the real
SummaryWriter.add_histogram_raw, so no tensor is ever copied to build a histogram. Tags: "<target>/<stat>",
"<target>/hist" (linear bins, under/overflow as the outer buckets), "<target>/log2_abs" (log2 |x|)."""
import math

import numpy as np

from .. import layout
from .base import scalar_items


def linear_buckets(rec):
    """(limits, counts) for add_histogram_raw: underflow, the bins, overflow; limits are upper edges."""
    edges = rec["hist_edges"]
    top = rec.get("running_max", math.nan)
    top = top if math.isfinite(top) and top > edges[-1] else edges[-1] + (edges[1] - edges[0])
    limits = np.concatenate([[edges[0]], edges[1:], [top]])
    counts = np.concatenate([[rec["underflow"]], rec["hist"], [rec["overflow"]]]).astype(np.float64)
    return limits, counts


_LOG2_UPPER = np.arange(layout.LOG_EXP_MIN, layout.LOG_EXP_MIN + layout.LOG_SLOTS - 1, dtype=np.float64)


def log2_buckets(log2_hist):
    """(limits, counts) over log2|x| for the nonzero finite values: slot 1 (below 2**-126) has upper edge
    -126, slot 2+k upper edge k-125. Trimmed to the occupied slots; None when there are none."""
    counts = np.asarray(log2_hist[1:], dtype=np.float64)
    nz = np.flatnonzero(counts)
    if nz.size == 0:
        return None
    lo, hi = nz[0], nz[-1] + 1
    return _LOG2_UPPER[lo:hi], counts[lo:hi]


class TensorBoardSink:
    def __init__(self, log_dir, writer=None):
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        # a deep queue: with the default (10) every add_* waits for the writer thread
        self.writer = writer or SummaryWriter(log_dir=str(log_dir), max_queue=100_000, flush_secs=30)

    def write(self, step, records):
        w = self.writer
        for rec in records:
            t = rec["target"]
            for stat, v in scalar_items(rec):
                w.add_scalar(f"{t}/{stat}", v, step)
            n = rec["finite"]
            if rec.get("hist") is not None and n > 0:
                limits, counts = linear_buckets(rec)
                mean = rec["mean"]
                m2 = rec["std"] ** 2 * (n - 1) if n > 1 else 0.0
                w.add_histogram_raw(f"{t}/hist", min=float(rec["running_min"]), max=float(limits[-1]), num=int(n),
                                    sum=float(mean * n), sum_squares=float(m2 + n * mean * mean),
                                    bucket_limits=limits.tolist(), bucket_counts=counts.tolist(), global_step=step)
            lg = log2_buckets(rec["log2_hist"]) if rec.get("log2_hist") is not None else None
            if lg is not None:
                limits, counts = lg
                mid = limits - 0.5
                w.add_histogram_raw(f"{t}/log2_abs", min=float(limits[0] - 1), max=float(limits[-1]),
                                    num=int(counts.sum()), sum=float(counts @ mid), sum_squares=float(counts @ mid ** 2),
                                    bucket_limits=limits.tolist(), bucket_counts=counts.tolist(), global_step=step)

    def write_alerts(self, step, alerts):
        for a in alerts:
            self.writer.add_text("alerts", a["message"], a["step"])

    def close(self):
        self.writer.flush()
        self.writer.close()
