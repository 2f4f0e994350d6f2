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

import numpy as np

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
    """Collects a file's records, headers and step-end markers in file order; items() resolves them. A reader that
    checks some records after the file is read takes their places in that order with place() and resolves them
    with the others through resolve()."""

    def __init__(self, path):
        self.path = path
        self.runs = []  # run ids in file order ("" for records before any header)
        self.entries = []  # (run index, step, (target, phase), record, position)
        self.last_end = {}  # run index -> position after its last step-end marker
        self.count = 0  # positions taken

    def start_run(self, run_id):
        self.runs.append(str(run_id))

    def _run(self):
        if not self.runs:
            self.runs.append("")
        return len(self.runs) - 1

    def record(self, step, rec):
        r = self._run()
        self.entries.append((r, step, (rec["target"], record_phase(rec)), rec, self.count))
        self.count += 1

    def place(self):
        """(run index, position) of a record whose step and target come later (resolve())."""
        r = self._run()
        self.count += 1
        return r, self.count - 1

    def step_end(self, step):
        self.last_end[self._run()] = self.count

    def items(self, stacklevel=3):
        """(step, record) pairs sorted by step, one per (step, target): the last written; warns (RunsWarning)
        once per fact: several runs, incomplete steps (left out), duplicates."""
        codes = {}
        e = self.entries
        won = self.resolve(np.array([x[0] for x in e], dtype=np.int64), np.array([x[1] for x in e], dtype=np.int64),
                           np.array([codes.setdefault(x[2], len(codes)) for x in e], dtype=np.int64),
                           np.array([x[4] for x in e], dtype=np.int64), stacklevel=stacklevel + 1)
        return [(e[i][1], e[i][3]) for i in won.tolist()]

    def resolve(self, run, step, key, pos, stacklevel=3):
        """The entries that stand, as indices into the arrays run (run index), step, key (a code per (target,
        phase)) and pos (position in file order), sorted by step, then position; warns as items()."""
        # Sinks write a step's records, then its marker, step after step: what a killed process left unfinished
        # is its run's records after the run's last marker.
        marked = np.array([bool(r) for r in self.runs] + [False], dtype=bool)
        end = np.array([self.last_end.get(r, 0) for r in range(len(self.runs))] + [0], dtype=np.int64)
        after = marked[run] & (pos >= end[run])
        incomplete = np.zeros(len(run), dtype=bool)  # every record of a (run, step) that has one after the marker
        for r in np.unique(run[after]).tolist():
            incomplete |= (run == r) & np.isin(step, np.unique(step[after & (run == r)]))
        keep = np.flatnonzero(~incomplete)
        o = keep[np.lexsort((pos[keep], key[keep], step[keep]))]
        ks, kk = step[o], key[o]
        new = np.ones(len(o), dtype=bool)  # the first entry of each (step, target)
        new[1:] = (ks[1:] != ks[:-1]) | (kk[1:] != kk[:-1])
        starts = np.flatnonzero(new)
        last = np.append(starts[1:], len(o))[: len(starts)] - 1
        won = o[last]
        dup_steps = ks[starts[(last - starts) > 0]]
        say = []
        if len(self.runs) > 1:
            spans = []
            for r, run_id in enumerate(self.runs):
                mine = step[run == r]
                span = f"steps {mine.min()}..{mine.max()}" if mine.size else "no steps"
                spans.append(f"{run_id or '(no header)'}: {span}")
            say.append(f"holds {len(self.runs)} runs appended one after another (a resumed or re-attached run): "
                       + "; ".join(spans))
        if incomplete.any():
            steps, counts = np.unique(step[incomplete], return_counts=True)
            say.append(f"step(s) {_some(steps.tolist())} incomplete: the writing process stopped before all of the "
                       f"step's targets were written ({_some(counts.tolist())} record(s)); left out")
        if dup_steps.size:
            say.append(f"{dup_steps.size} (step, target) record(s) written more than once (steps "
                       f"{_some(np.unique(dup_steps).tolist())}): the last written of each is used")
        for msg in say:
            warnings.warn(f"{self.path}: {msg}", RunsWarning, stacklevel=stacklevel)
        return won[np.lexsort((pos[won], step[won]))]


def _some(values, n=5):
    values = list(values)
    return ", ".join(map(str, values[:n])) + (", ..." if len(values) > n else "")
