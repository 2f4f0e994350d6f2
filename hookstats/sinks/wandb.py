"""WandbSink (optional): logs chosen scalars and both histograms of each step to a Weights & Biases run;
pass a run, or keyword arguments for wandb.init (mode="offline" works with no account).

hookstats flushes several steps at once, after the user's own wandb.log calls of those steps, so it never
passes step= (W&B drops a row whose step is below the run's current one): each row carries its step as
`<prefix>step`, declared with define_metric as the x-axis of every `<prefix>*` metric. W&B keeps one step
counter per run and these rows advance it: the user's own wandb.log calls beside them must not pass step=
either (or must have an x-axis of their own, from define_metric). The gradient norms (Sink.write_grad_norms) are rows
of their own, at the same `<prefix>step`; a flight (Sink.write_flight) is a wandb.Table logged as `<prefix>flight` at
the alert's step, its message kept in the run summary's `<prefix>flights`. A resumed run (Sink.resume) cannot take back the
rows a W&B run holds: rewinding a W&B run is wandb.init(resume_from=...)'s."""
import numpy as np

from ..records import KEY_FIELDS
from .base import DASHBOARD_STATS, PREFIX, Sink
from .histograms import log2_buckets, value_histograms
from .names import stat_name


def histograms(wandb, pairs):
    """{`<base>/hist`: wandb.Histogram, `<base>/log2_abs`: ...} for the histograms each (base, record) has
    (`hist`: the configured linear bins, else the view fitted to the float buckets)."""
    pairs = list(pairs)
    out = {}
    for (base, rec), lin in zip(pairs, value_histograms([rec for _, rec in pairs])):
        for name, buckets in (("hist", lin), ("log2_abs", log2_buckets(rec))):
            if buckets is not None:
                edges, counts = buckets
                out[stat_name(base, name)] = wandb.Histogram(np_histogram=(counts.astype(np.int64), edges))
    return out


class WandbSink(Sink):
    """stats: the scalars per target and step (default DASHBOARD_STATS; any of DASHBOARD_CHOICES);
    histograms: False for none; prefix: of every key, the step axis `<prefix>step` included. A run passed
    in stays the caller's: close() does not finish it."""

    def __init__(self, run=None, stats=DASHBOARD_STATS, histograms=True, prefix=PREFIX, **init_kwargs):
        from ..extras import require
        self._wandb = wandb = require("wandb", "WandbSink")
        super().__init__(stats, prefix)
        self.histograms = bool(histograms)
        if not self.prefix:
            raise ValueError("WandbSink needs a non-empty prefix: its metrics share the step axis <prefix>step")
        self.step_key = self.prefix + "step"
        self._own = run is None
        self._alerts, self._flights = [], []
        self.run = run if run is not None else wandb.init(**init_kwargs)
        self.run.define_metric(self.step_key, hidden=True)
        self.run.define_metric(self.prefix + "*", step_metric=self.step_key)

    def write(self, step, records):
        data = {self.step_key: step}
        for rec in records:
            data.update(self.named_values(rec))
        if self.histograms:
            data.update(histograms(self._wandb, ((self.name(rec), rec) for rec in records)))
        self.run.log(data)

    def write_alerts(self, step, alerts):
        self._alerts.extend(a["message"] for a in alerts)
        self.run.summary[self.prefix + "alerts"] = list(self._alerts)

    def write_flight(self, flight):
        """The steps before an alert as one table: a row per recorded (step, target), its KEY_FIELDS and the
        history's scalars (NaN where a statistic was not measured)."""
        stats = list(flight.columns)
        table = self._wandb.Table(columns=["step", *KEY_FIELDS, *stats])
        for step, rec in flight.records():
            table.add_data(step, *(rec.get(k) for k in KEY_FIELDS), *(rec[k] for k in stats))
        self.run.log({self.step_key: flight.step, self.prefix + "flight": table})
        self._flights.append(flight.headline)
        self.run.summary[self.prefix + "flights"] = list(self._flights)

    def write_grad_norms(self, norms):
        """A row per step: grad_norm/total, with clip_norm grad_norm/clip_coef (1: no clipping), and
        grad_norm/<target>/share (the target's share of the squared total) of each target measured at the step."""
        total, share = norms.total, norms.share
        coef = norms.clip_coef if norms.clip_norm is not None else None
        base = self.prefix + "grad_norm/"
        for s, step in enumerate(norms.steps):
            row = {self.step_key: step, base + "total": float(total[s])}
            if coef is not None:
                row[base + "clip_coef"] = float(coef[s])
            row.update({f"{base}{t}/share": float(share[s, p]) for p, t in enumerate(norms.targets)
                        if norms.present[s, p]})
            self.run.log(row)

    def close(self):
        if self._own and self.run is not None:
            self.run.finish()
            self.run = None

