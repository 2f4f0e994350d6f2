"""Runs in one history file. A file sink opens its file for appending and first writes a run header (a run
id), and after each step's records a step-end marker with their number. Reading a file back, Ledger says what
a reader must know: a file holding several runs (a resumed or re-attached run appends), (step, target)
records written twice (the last written wins), and steps whose records a killed process left incomplete
(a run's records after its last step-end marker: left out). Files of versions without headers are read as before."""
import datetime
import os
import socket
import uuid
import warnings

from ..phases import record_phase


class HistoryFileWarning(UserWarning):
    """Something a reader of a saved history file should know: `hookstats report` prints these."""


class RunsWarning(HistoryFileWarning):
    """A history file holds several runs, duplicate (step, target) records, or incomplete steps."""


class LayoutWarning(HistoryFileWarning):
    """A history file's run was written with another state layout: its slots (log2 histogram, float buckets) are
    left out, its other statistics read."""


def new_run_id():
    return uuid.uuid4().hex[:12]


def run_header(run_id=None):
    """What a sink writes when it opens its file: the run id (a new one when None), this process and the time."""
    return {"run": run_id or new_run_id(), "pid": os.getpid(), "host": socket.gethostname(),
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


class Ledger:
    """Collects a file's records, headers and step-end markers in file order; items() resolves them."""

    def __init__(self, path):
        self.path = path
        self.runs = []  # run ids in file order ("" for records before any header)
        self.entries = []  # (run index, step, (target, phase), record)
        self.last_end = {}  # run index -> position (in entries) after its last step-end marker
        self.steps = {}  # run index -> [first step, last step] of its records

    def start_run(self, run_id):
        self.runs.append(str(run_id))

    def _run(self):
        if not self.runs:
            self.runs.append("")
        return len(self.runs) - 1

    def record(self, step, rec):
        r = self._run()
        span = self.steps.setdefault(r, [step, step])
        span[0], span[1] = min(span[0], step), max(span[1], step)
        self.entries.append((r, step, (rec["target"], record_phase(rec)), rec))

    def step_end(self, step):
        self.last_end[self._run()] = len(self.entries)

    def items(self, stacklevel=3):
        """(step, record) pairs sorted by step, one per (step, target): the last written; warns (RunsWarning)
        once per fact: several runs, incomplete steps (left out), duplicates."""
        # Sinks write a step's records, then its marker, step after step: what a killed process left unfinished
        # is its run's records after the run's last marker.
        marked = {r for r, run in enumerate(self.runs) if run}
        incomplete = {(r, step) for pos, (r, step, _, _) in enumerate(self.entries)
                      if r in marked and pos >= self.last_end.get(r, 0)}
        winners, dups = {}, set()
        for pos, (r, step, target, rec) in enumerate(self.entries):
            if (r, step) in incomplete:
                continue
            if (step, target) in winners:
                dups.add((step, target))
            winners[(step, target)] = pos
        say = []
        if len(self.runs) > 1:
            spans = []
            for r, run in enumerate(self.runs):
                span = f"steps {self.steps[r][0]}..{self.steps[r][1]}" if r in self.steps else "no steps"
                spans.append(f"{run or '(no header)'}: {span}")
            say.append(f"holds {len(self.runs)} runs appended one after another (a resumed or re-attached run): "
                       + "; ".join(spans))
        if incomplete:
            steps = sorted({s for _, s in incomplete})
            held = {}
            for r, step, _, _ in self.entries:
                if (r, step) in incomplete:
                    held[step] = held.get(step, 0) + 1
            counts = [held[s] for s in steps]
            say.append(f"step(s) {_some(steps)} incomplete: the writing process stopped before all of the step's "
                       f"targets were written ({_some(counts)} record(s)); left out")
        if dups:
            steps = sorted({s for s, _ in dups})
            say.append(f"{len(dups)} (step, target) record(s) written more than once (steps {_some(steps)}): "
                       f"the last written of each is used")
        for msg in say:
            warnings.warn(f"{self.path}: {msg}", RunsWarning, stacklevel=stacklevel)
        order = sorted(winners.values(), key=lambda pos: (self.entries[pos][1], pos))
        return [(self.entries[pos][1], self.entries[pos][3]) for pos in order]


def _some(values, n=5):
    values = list(values)
    return ", ".join(map(str, values[:n])) + (", ..." if len(values) > n else "")
