"""TensorBoardSink: chosen scalars per target and both histograms, rebuilt from our bins with the real
SummaryWriter.add_histogram_raw (no tensor is copied to build a histogram). Every tag starts with one
prefix, so TensorBoard shows one collapsible section, named by hookstats/sinks/names.py:
"hookstats/<module>/<kind>/<stat>", ".../hist" (the linear bins with under/overflow as the outer buckets where
configured, else the view fitted to the float buckets), ".../log2_abs" (log2 |x|); eval records ".../eval/<stat>"."""
import os

from .base import DASHBOARD_STATS, PREFIX, Sink
from .histograms import log2_buckets, value_histograms
from .names import stat_name


def add_histograms(writer, pairs, step):
    """Both histograms of each (base, record) to a SummaryWriter as `<base>/hist` and `<base>/log2_abs`."""
    pairs = list(pairs)
    for (base, rec), lin in zip(pairs, value_histograms([rec for _, rec in pairs])):
        _add(writer, base, rec, lin, step)


def _add(writer, base, rec, lin, step):
    if lin is not None:
        edges, counts = lin
        # num: the values the histogram holds (hist_count, where known: a stats() record's histogram steps' values,
        # fewer than `finite`'s with hist_every > 1); sum and sum_squares: the moments of the record's finite
        # values, scaled to num
        n, mean, std = rec["finite"], rec["mean"], rec["std"]
        held = rec.get("hist_count")
        if held is not None and held == held and held > 0:
            n = int(held)
        m2 = std ** 2 * (n - 1) if n > 1 else 0.0
        writer.add_histogram_raw(stat_name(base, "hist"), min=float(edges[0]), max=float(edges[-1]), num=int(n),
                                 sum=float(mean * n), sum_squares=float(m2 + n * mean * mean),
                                 bucket_limits=edges[1:].tolist(), bucket_counts=counts.tolist(), global_step=step)
    lg = log2_buckets(rec)
    if lg is not None:
        edges, counts = lg
        mid = (edges[:-1] + edges[1:]) / 2
        writer.add_histogram_raw(stat_name(base, "log2_abs"), min=float(edges[0]), max=float(edges[-1]),
                                 num=int(counts.sum()), sum=float(counts @ mid), sum_squares=float(counts @ mid ** 2),
                                 bucket_limits=edges[1:].tolist(), bucket_counts=counts.tolist(), global_step=step)


def _writer(log_dir, purge_step=None):
    from ..extras import require
    require("tensorboard", "TensorBoardSink")  # torch.utils.tensorboard's own error names no install
    from torch.utils.tensorboard import SummaryWriter

    # a deep queue: with the default (10) every add_* waits for the writer thread
    return SummaryWriter(log_dir=str(log_dir), max_queue=100_000, flush_secs=30, purge_step=purge_step)


class TensorBoardSink(Sink):
    """log_dir: where a SummaryWriter of ours writes; or writer: a SummaryWriter (or anything with its
    add_scalar/add_histogram_raw/add_text) that stays the caller's: close() flushes it, never closes it.
    stats: the scalars per target and step (default DASHBOARD_STATS; any of DASHBOARD_CHOICES, or () for
    none); histograms: False for none; prefix: of every tag."""

    def __init__(self, log_dir=None, writer=None, stats=DASHBOARD_STATS, histograms=True, prefix=PREFIX):
        if (log_dir is None) == (writer is None):
            raise ValueError("TensorBoardSink needs log_dir or writer (one of them)")
        super().__init__(stats, prefix)
        self.histograms = bool(histograms)
        if writer is not None:
            needs = ("add_scalar", "add_text", "flush") + (("add_histogram_raw",) if histograms else ())
            missing = [m for m in needs if not callable(getattr(writer, m, None))]
            if missing:
                raise ValueError(f"TensorBoardSink: writer must be a SummaryWriter (or have its {', '.join(needs)}); "
                                 f"got {type(writer).__name__} {writer!r:.60}, without {', '.join(missing)}")
        elif isinstance(log_dir, bytes) or not isinstance(log_dir, (str, os.PathLike)) or not str(log_dir).strip():
            raise ValueError(f"TensorBoardSink: log_dir must be a folder path (str or os.PathLike), got {log_dir!r:.60}")
        self._own, self.log_dir = writer is None, log_dir
        self.writer = writer if writer is not None else _writer(log_dir)

    def resume(self, step):
        """A writer of ours starts again with SummaryWriter's purge_step: TensorBoard hides the events of `step`
        and later written before it. A caller's writer is the caller's: make it with purge_step=step."""
        if self._own:
            self.writer.close()
            self.writer = _writer(self.log_dir, purge_step=step)

    def write(self, step, records):
        for rec in records:
            for name, v in self.named_values(rec):
                self.writer.add_scalar(name, v, step)
        if self.histograms:
            add_histograms(self.writer, ((self.name(rec), rec) for rec in records), step)

    def write_alerts(self, step, alerts):
        for a in alerts:
            self.writer.add_text(self.prefix + "alerts", a["message"], a["step"])

    def write_flight(self, flight):
        self.writer.add_text(self.prefix + "flight", flight.headline, flight.step)

    def write_grad_norms(self, norms):
        """grad_norm/total per step and grad_norm/<target>/share (the target's share of its square); with
        clip_norm the clipping factor (1: no clipping)."""
        total, share = norms.total, norms.share
        coef = norms.clip_coef if norms.clip_norm is not None else None
        base = self.prefix + "grad_norm/"
        for s, step in enumerate(norms.steps):
            self.writer.add_scalar(base + "total", float(total[s]), step)
            if coef is not None:
                self.writer.add_scalar(base + "clip_coef", float(coef[s]), step)
            for p, t in enumerate(norms.targets):
                if norms.present[s, p]:
                    self.writer.add_scalar(f"{base}{t}/share", float(share[s, p]), step)

    def close(self):
        self.writer.flush()
        if self._own:
            self.writer.close()

