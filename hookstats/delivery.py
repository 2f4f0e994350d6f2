"""Delivery of the history's recorded steps: the step columns a flush copied to the host become records
(hookstats/records.py) for the sinks, MemorySink first (what mon.history() reads); a sink that raises is dropped
with a HistoryWarning, and new alerts are told to the user once."""
import numpy as np

from .phases import Phase
from .records import (bucket_columns, key_fields, no_bucket_columns, no_hist_columns, select_steps, step_columns,
                      step_records)
from .sinks.base import Steps, protocol
from .sinks.memory import MemorySink
from .sinks.runs import new_run_id
from .user_warning import warn_user


class HistoryWarning(RuntimeWarning):
    """The history or a sink failed; the training step goes on without it."""


class Delivery:
    """The sinks of one history: `memory_sink` (keeps the last `keep` steps) and the user's; `alerts`, every alert
    raised so far, oldest first. rules: the AlertRules that read the alert rows; order: the targets' step order."""

    def __init__(self, cfg, sinks, keep, rules, order):
        self.cfg, self.rules, self._order = cfg, rules, order
        self.memory_sink = MemorySink(max_steps=keep)
        self.sinks = [self.memory_sink] + sinks
        run_id = new_run_id()  # one run, one id: every file sink of this history names it
        for sink in sinks:
            protocol(sink, "join_run")(run_id)
        self.alerts = []
        self._reported = set()

    def deliver(self, arow, fs, counts, steps, keys, host_b, hist, phase=Phase.TRAIN):
        """One copy of a ring: arow its alert rows, fs [S, T, F] and counts [S, T, step slots] its step slots, steps
        their step numbers, host_b the float buckets' growth over the window (or None), hist per step whether it
        counted the histograms."""
        cols = step_columns(fs, counts, self.cfg)
        present = cols["count"] != 0
        active = np.flatnonzero(present.any(axis=1))  # steps where nothing was measured go nowhere
        if len(active) < len(steps):
            hist = [hist[s] for s in active.tolist()]
            steps = [steps[s] for s in active.tolist()]
            cols = select_steps(cols, active)
            present = present[active]
        if steps:
            grown = None if host_b is None else host_b.numpy()
            if grown is not None and not grown.any():  # a window without a histogram step: no buckets, not empty ones
                grown = None
            # the window's buckets go with its last step that counted histograms (the buckets grow on no other),
            # so their figures are written at a step that counted them; the other steps carry none
            counted = [k for k, h in enumerate(hist) if h]
            at = counted[-1] if counted and grown is not None else len(steps) - 1
            self._write_runs(steps[:at], keys, no_bucket_columns(cols, range(at), self.cfg), present[:at], hist[:at],
                             phase)
            tail = bucket_columns(fs[active[at]], counts[active[at]], grown, self.cfg)
            self._write_runs(steps[at:at + 1], keys, tail, present[at:at + 1], hist[at:at + 1], phase)
            rest = range(at + 1, len(steps))
            self._write_runs(steps[at + 1:], keys, no_bucket_columns(cols, rest, self.cfg), present[at + 1:],
                             hist[at + 1:], phase)
        new = self.rules.read(arow, keys, self._reported, order=self._order) if phase == Phase.TRAIN else None
        if new:
            self.alerts.extend(new)
            for msg in brief(new):
                warn_user(f"hookstats alert: {msg}", self.rules.warning)
            self._write("write_alerts", new[0]["step"], new)

    def _write_runs(self, steps, keys, cols, present, hist, phase=Phase.TRAIN):
        """_write_steps per run of steps that did (hist[k]) or did not count histograms."""
        start = 0
        for end in range(1, len(steps) + 1):
            if end == len(steps) or hist[end] != hist[start]:
                part = select_steps(cols, slice(start, end))
                self._write_steps(steps[start:end], keys, part if hist[start] else no_hist_columns(part, self.cfg),
                                  present[start:end], phase)
                start = end

    def _write_steps(self, steps, keys, cols, present, phase=Phase.TRAIN):
        """Every sink gets the steps as one Steps: arrays, and records built only if a sink reads them."""
        if steps:
            self._write("write_steps", Steps(steps, [key_fields(k, phase) for k in keys], cols, present,
                                             lambda: step_records(keys, cols, present, phase)))

    def _write(self, method, *args):
        for sink in list(self.sinks):
            try:
                protocol(sink, method)(*args)
            except Exception as e:
                self.sinks.remove(sink)
                warn_user(f"hookstats: sink {type(sink).__name__} failed and was dropped: {e!r}", HistoryWarning)
                try:
                    protocol(sink, "close")()  # its files and locks go now, not at the run's end
                except Exception:
                    pass  # the warning above already told why it went

    def resume(self, step):
        """Tells every sink that the run goes on from `step` (Sink.resume: an earlier run's later steps are
        superseded)."""
        self._write("resume", step)

    def close(self):
        """Closes every sink (one that fails is told, the others still close)."""
        for sink in self.sinks:
            try:
                protocol(sink, "close")()
            except Exception as e:
                warn_user(f"hookstats: closing sink {type(sink).__name__} failed: {e!r}", HistoryWarning)


def brief(alerts):
    """One message per alert, except NaN/Inf: the first target to see one, then a count of the others."""
    nonfinite = [a for a in alerts if a["kind"] == "nonfinite"]
    out = [a["message"] for a in alerts if a["kind"] != "nonfinite"]
    if nonfinite:
        more = len(nonfinite) - 1
        out.insert(0, nonfinite[0]["message"] + (f"; {more} more target(s) saw NaN/Inf since" if more else ""))
    return out
