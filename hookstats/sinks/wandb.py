"""WandbSink (optional): logs the scalars and the linear histogram of each step to a Weights & Biases run;
pass a run, or keyword arguments for wandb.init (mode="offline" works with no account)."""
import numpy as np

from .base import scalar_items


class WandbSink:
    def __init__(self, run=None, **init_kwargs):
        try:
            import wandb
        except ImportError as e:
            raise ImportError("WandbSink needs the wandb package: pip install wandb") from e
        self._wandb = wandb
        self._own = run is None
        self._alerts = []
        self.run = run if run is not None else wandb.init(**init_kwargs)

    def write(self, step, records):
        data = {}
        for rec in records:
            t = rec["target"]
            data.update((f"{t}/{stat}", v) for stat, v in scalar_items(rec))
            if rec.get("hist") is not None and rec["hist"].sum() > 0:
                data[f"{t}/hist"] = self._wandb.Histogram(np_histogram=(np.asarray(rec["hist"]), rec["hist_edges"]))
        self.run.log(data, step=step)

    def write_alerts(self, step, alerts):
        self._alerts.extend(a["message"] for a in alerts)
        self.run.summary["hookstats/alerts"] = list(self._alerts)

    def close(self):
        if self._own and self.run is not None:
            self.run.finish()
            self.run = None
