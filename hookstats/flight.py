"""The flight recorder (AlertRules(flight=K)): when a flush raises new alerts, the last K recorded steps of every
train target up to the first alert's step, as one Flight, for the sinks (Sink.write_flight) and mon.flights.

Nothing is read from the device for it: the history's flushes bring every recorded step to the host anyway, and
the recorder keeps a copy of the scalar columns of the steps delivered, trimmed after each flush to the K newest. A flight is assembled only in a flush that raised alerts. K may exceed the device ring
(history=N): the steps arrive over several flushes. A flight holds fewer than K steps only when fewer were recorded
before the alert step since attach."""
import collections
import dataclasses

import numpy as np

from .records import key_fields
from .statistics import SCALARS


@dataclasses.dataclass
class Flight:
    """The steps before an alert, kept by ``attach(..., alerts=AlertRules(flight=K))``: ``mon.flights`` holds one
    per flush that raised alerts, and every sink gets it (``Sink.write_flight``).

    ``step``, ``kind``, ``target`` and ``message`` are those of the alert that triggered it (the first new one by
    step, then in the order a training step reaches the targets); ``alerts`` lists every alert raised with it.
    ``steps`` are the recorded steps up to and including ``step`` (at most K); ``keys`` describe the training
    targets seen in them, in step order (dicts of target, module, kind, leaf and phase, as in a history record);
    ``columns`` maps each scalar statistic of the history to a float64 array [steps, targets], NaN where a target
    has no record at a step; ``present`` [steps, targets] says which (step, target) pairs have a record.
    """

    step: int
    kind: str
    target: str
    message: str
    alerts: list
    steps: list
    keys: list
    columns: dict
    present: np.ndarray

    @property
    def targets(self):
        """[T]: the target ids, in step order."""
        return [k["target"] for k in self.keys]

    @property
    def headline(self):
        """The flight in one line: the alert's message and the steps it holds."""
        if not self.steps:
            return self.message
        return f"{self.message}: steps {self.steps[0]}..{self.steps[-1]} of {len(self.targets)} targets recorded"

    def series(self, stat, target):
        """Statistic `stat` of `target` at each of self.steps (NaN where it has no record)."""
        return self.columns[stat][:, self.targets.index(target)]

    def records(self):
        """Yields (step, record) of each (step, target) pair that has a record: a dict of the target's fields
        (target, module, kind, leaf, phase) and every scalar statistic, as in a history record."""
        for s, step in enumerate(self.steps):
            for t, key in enumerate(self.keys):
                if self.present[s, t]:
                    yield step, {**key, **{k: v[s, t].item() for k, v in self.columns.items()}}


class FlightRecorder:
    """steps: K; order: the step order, a sort key of TargetKey (alerts.step_order)."""

    def __init__(self, steps, order):
        self.k, self._order = steps, order
        self._chunks = collections.deque()  # (step numbers, TargetKeys, {stat: [S, T]}, present [S, T])

    def add(self, steps, keys, cols, present):
        """A delivered run of train steps (the columns of records.step_columns)."""
        if steps:
            # copies: some columns are views of the host staging buffer, which the next flush overwrites
            scalars = {k: np.array(cols[k]) for k in SCALARS if cols.get(k) is not None and np.ndim(cols[k]) == 2}
            self._chunks.append((list(steps), list(keys), scalars, np.asarray(present, dtype=bool)))

    def trim(self):
        """After a flush: keeps the chunks that hold the K newest steps (a step may span chunks: one per device)."""
        newest = sorted({s for steps, *_ in self._chunks for s in steps})[-self.k:]
        first = newest[0] if newest else None
        while self._chunks and (first is None or max(self._chunks[0][0]) < first):
            self._chunks.popleft()

    def take(self, alerts):
        """The Flight of `alerts` (new alerts of one flush, sorted by step then step order; the first triggers)."""
        first = alerts[0]
        at = {}  # step -> {TargetKey: (chunk, slot, target column)}
        for c, (steps, keys, _, present) in enumerate(self._chunks):
            for s, step in enumerate(steps):
                if step <= first["step"]:
                    row = at.setdefault(step, {})
                    for t in np.flatnonzero(present[s]).tolist():
                        row[keys[t]] = (c, s, t)
        steps = sorted(at)[-self.k:]
        keys = sorted({k for step in steps for k in at[step]}, key=self._order)
        stats = [k for k in SCALARS if any(k in ch[2] for ch in self._chunks)]
        columns = {k: np.full((len(steps), len(keys)), np.nan) for k in stats}
        present = np.zeros((len(steps), len(keys)), dtype=bool)
        col = {k: i for i, k in enumerate(keys)}
        for i, step in enumerate(steps):
            for key, (c, s, t) in at[step].items():
                present[i, col[key]] = True
                for k, v in self._chunks[c][2].items():
                    columns[k][i, col[key]] = v[s, t]
        return Flight(step=first["step"], kind=first["kind"], target=first["target"], message=first["message"],
                      alerts=[dict(a) for a in alerts], steps=steps, keys=[key_fields(k) for k in keys],
                      columns=columns, present=present)
