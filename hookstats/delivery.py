"""Delivery of the history's recorded steps: the step columns a flush copied to the host become records
(hookstats/records.py) for the sinks, MemorySink first (what mon.history() reads); a sink that raises is dropped
with a HistoryWarning, and new alerts are told to the user once."""
import numpy as np

from .amax_window import AmaxWindow
from .flight import FlightRecorder
from .grad_norms import PARAM_GRAD, from_columns as grad_norm_columns
from .phases import Phase
from .records import (bucket_rows, key_fields, no_bucket_columns, no_hist_columns, select_steps, step_columns,
                      step_records)
from .sinks.base import Steps, protocol
from .sinks.memory import MemorySink
from .sinks.runs import new_run_id
from .user_warning import warn_user


class HistoryWarning(RuntimeWarning):
    """The history or a sink failed; the training step goes on without it."""


class Delivery:
    """The sinks of one history: `memory_sink` (keeps the last `keep` steps) and the user's; `alerts`, every alert
    raised so far, oldest first; `flights`, the flight.Flight of each flush that raised alerts (rules.flight > 0).
    rules: the AlertRules that read the alert rows; order: the targets' step order; clip_norm: the max_norm of
    the clipping the parameter gradients' norms are told against (grad_norms.py), or None."""

    def __init__(self, cfg, sinks, keep, rules, order, clip_norm=None):
        self.cfg, self.rules, self._order, self.clip_norm = cfg, rules, order, clip_norm
        self.flight = FlightRecorder(rules.flight, order) if rules.enabled and rules.flight else None
        self.flights = []
        self.memory_sink = MemorySink(max_steps=keep)
        self.sinks = [self.memory_sink] + sinks
        run_id = new_run_id()  # one run, one id: every file sink of this history names it
        for sink in sinks:
            protocol(sink, "join_run")(run_id)
        self.alerts = []
        self._reported = set()
        self.amaxes = AmaxWindow(cfg.amax_history_len)

    def deliver(self, arow, fs, counts, steps, keys, grown, grown_at, hist, phase=Phase.TRAIN, *, amax):
        """One copy of a ring: arow its alert rows, fs [S, T, F] and counts [S, T, step slots] its step slots, steps
        their step numbers, grown [J, T, FLOAT_SLOTS] the float buckets' growth at each of the J steps that counted
        them (or None), grown_at the slot of each, hist per step whether it counted the histograms, amax [S, T] each
        step's own largest |x| (NaN where it measured nothing)."""
        cols = step_columns(fs, counts, self.cfg)
        present = cols["count"] != 0
        active = np.flatnonzero(present.any(axis=1))  # steps where nothing was measured go nowhere
        if len(active) < len(steps):
            hist = [hist[s] for s in active.tolist()]
            steps = [steps[s] for s in active.tolist()]
            cols = select_steps(cols, active)
            present = present[active]
            amax = amax[active]
        if steps:
            # each step that counted histograms carries its own buckets' figures (derived for all of them at once);
            # the other steps carry none, and a step whose buckets counted nothing none either (not empty ones)
            where = {slot: k for k, slot in enumerate(active.tolist())}
            own = [] if grown is None else [(where[at], j) for j, at in enumerate(grown_at)
                                            if at in where and grown[j].any()]
            ids = [k.id for k in keys]
            self.amaxes.add(phase, ids, steps, amax, present)
            mine = None
            if own:
                at, rows = [k for k, _ in own], [j for _, j in own]
                before = np.stack([self.amaxes.before(phase, ids, steps[k]) for k in at])
                mine = bucket_rows(fs[active[at]], counts[active[at]], grown[rows], self.cfg, before)
            start = 0
            for n, (k, _) in enumerate(own):
                self._write_runs(steps[start:k], keys, no_bucket_columns(cols, range(start, k), self.cfg),
                                 present[start:k], hist[start:k], phase)
                self._write_runs(steps[k:k + 1], keys, select_steps(mine, slice(n, n + 1)), present[k:k + 1],
                                 hist[k:k + 1], phase)
                start = k + 1
            self._write_runs(steps[start:], keys, no_bucket_columns(cols, range(start, len(steps)), self.cfg),
                             present[start:], hist[start:], phase)
            self.amaxes.prune(phase, steps[-1])
            if phase == Phase.TRAIN and any(k.kind == PARAM_GRAD for k in keys):
                self._write("write_grad_norms", grad_norm_columns(steps, [key_fields(k) for k in keys], cols, present,
                                                                  self.clip_norm))
        new = self.rules.read(arow, keys, self._reported, order=self._order) if phase == Phase.TRAIN else None
        if new:
            self.alerts.extend(new)
            for msg in brief(new):
                warn_user(f"hookstats alert: {msg}", self.rules.warning)
            self._write("write_alerts", new[0]["step"], new)
            if self.flight is not None:
                self._record_flight(new)
        if self.flight is not None and phase == Phase.TRAIN:
            self.flight.trim()

    def _record_flight(self, alerts):
        try:
            flight = self.flight.take(alerts)
        except Exception as e:  # the alerts and the steps went out already: only the flight is lost
            self.flight = None
            warn_user(f"hookstats: the flight recorder stopped after an error: {e!r}", HistoryWarning)
            return
        self.flights.append(flight)
        self._write("write_flight", flight)

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
            if self.flight is not None and phase == Phase.TRAIN:
                self.flight.add(steps, keys, cols, present)
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
        superseded), and forgets the alerts and flights of those steps: the run that goes on may raise them again."""
        gone = [a for a in self.alerts if a["step"] >= step]
        self.alerts = [a for a in self.alerts if a["step"] < step]
        self._reported.difference_update((a["target"], a["kind"]) for a in gone)
        self.flights = [f for f in self.flights if f.step < step]
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
