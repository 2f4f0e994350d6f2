"""MemorySink: keeps the last `max_steps` steps in memory; the source of Monitor.history()."""
import collections

from .base import scalar_items


class MemorySink:
    def __init__(self, max_steps=None):
        if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1):
            raise ValueError(f"max_steps must be None or an int >= 1, got {max_steps!r}")
        self.steps = collections.deque(maxlen=max_steps)  # (step, records)
        self.alerts = []

    def write(self, step, records):
        self.steps.append((step, records))

    def write_alerts(self, step, alerts):
        self.alerts.extend(alerts)

    def close(self):
        pass

    def items(self):
        """(step, record) pairs, oldest first."""
        for step, records in self.steps:
            for rec in records:
                yield step, rec

    def columns(self):
        """The long table as plain lists: {"step": [...], "target": [...], "kind", "stat", "value"}."""
        cols = {"step": [], "target": [], "kind": [], "stat": [], "value": []}
        for step, rec in self.items():
            for stat, v in scalar_items(rec):
                cols["step"].append(step)
                cols["target"].append(rec["target"])
                cols["kind"].append(rec["kind"])
                cols["stat"].append(stat)
                cols["value"].append(v)
        return cols

    def frame(self):
        """A pandas DataFrame of columns() when pandas is installed, else columns() itself."""
        try:
            import pandas as pd
        except ImportError:
            return self.columns()
        return pd.DataFrame(self.columns())

