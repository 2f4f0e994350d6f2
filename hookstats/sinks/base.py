"""What every sink shares: the Sink base class (the write protocol and the dashboard selection), the delivery it
gets (Steps) and the record format.

records: one dict per target measured in a step (hookstats.records.step_records): the KEY_FIELDS target, module,
kind, leaf, phase, then the statistics of hookstats.statistics.TABLE that history records have (histograms as
NumPy arrays, None when switched off). Which of them the file sinks write (SCALARS) and the dashboards get
(DASHBOARD_STATS by default, any of DASHBOARD_CHOICES) is said in that table.
"""
import math
import numbers
import warnings

from .. import statistics
from ..records import KEY_FIELDS  # noqa: F401 (the record format, here with the rest of it)
from ..statistics import DASHBOARD_CHOICES, DASHBOARD_STATS, HIST_FIGURES, SCALARS
from .names import PREFIX, record_name, stat_name
from .runs import HistoryFileWarning

PROGRESS_CHARS = 1 << 20  # file_lines(progress=...) says how far it read once per this many characters


class Steps:
    """What the history hands its sinks at a flush: consecutive recorded steps of one phase, as arrays and, for
    the sinks that take records, as (step, records) pairs when iterated (built once, on first use).
    steps [S]; keys [T]: dicts of the KEY_FIELDS; columns {field: array [S, T] (histograms [S, T, size]), or None
    when switched off; hist_edges: one array}; present [S, T] bool: the (step, target) pairs that have a record;
    missing {field: [S, T] bool}: the records whose histogram `field` is None (MemorySink.write_steps says more);
    records: a function giving each step's records, in order (None: the arrays alone, for array sinks)."""

    def __init__(self, steps, keys, columns, present, records=None, missing=None):
        self.steps, self.keys, self.columns, self.present = list(steps), keys, columns, present
        self.missing = missing or {}
        self._build, self._records = records, None

    def __len__(self):
        return len(self.steps)

    def __iter__(self):
        if self._records is None:
            if self._build is None:
                raise TypeError("these Steps carry arrays only: no records to iterate")
            self._records = list(self._build())
        return zip(self.steps, self._records)


class Sink:
    """The base of every sink. The history gives a sink each flush with write_steps(steps) (a Steps), the alerts
    it raises with write_alerts(step, alerts), the step a resumed run goes on from with resume(step) and ends
    with close(). A sink of records defines write(step,
    records), which the default write_steps calls step by step; one that takes the arrays (MemorySink) overrides
    write_steps. An object that is no Sink but has write(step, records) and close() is taken as one (protocol()).

    The dashboard selection: `stats`, the statistics values() gives of a record (default every scalar; the
    dashboards DASHBOARD_STATS, any of DASHBOARD_CHOICES), and `prefix`, that name() puts before every name
    (sinks/names.py: `<prefix><module>/<kind><leaf>[/eval]`, then stat_name(base, stat))."""

    stats = SCALARS
    prefix = PREFIX

    def __init__(self, stats=SCALARS, prefix=PREFIX):
        self.stats, self.prefix = check_stats(stats), check_prefix(prefix)

    def write(self, step, records):
        """One step's records (a list of dicts, see the module docstring): where a sink of records writes them."""
        raise NotImplementedError(f"{type(self).__name__} defines neither write(step, records) nor write_steps(steps)")

    def write_steps(self, steps):
        """A flush (a Steps): write(step, records) for each of its steps, unless a subclass takes the arrays."""
        for step, records in steps:
            self.write(step, records)

    def write_alerts(self, step, alerts):
        """The alerts raised at a flush (dicts with step, target, kind, message): a sink keeps none unless it says."""

    def write_flight(self, flight):
        """The steps before an alert (a hookstats.Flight), given in the flush that raised it when
        AlertRules(flight=K) asks for them: a sink keeps none unless it says (a file sink writes flight_<step>.jsonl
        beside its file)."""

    def write_grad_norms(self, norms):
        """The parameter gradients' norms of a flush's steps (a hookstats.GradNorms), given with
        param_grads=True: a sink keeps none unless it says (the dashboards log them). They are this rank's
        own: a sharded model's global norm is mon.grad_norms(group=...)'s."""

    def resume(self, step):
        """The run goes on from `step` (attach(start_step=step), or mon.load_state_dict() of a checkpoint taken
        before it): what an earlier run wrote of `step` and later is superseded. A sink keeps all unless it says."""

    def join_run(self, run_id):
        """The run id of the monitor whose history feeds this sink, told before its first write: a sink that names
        its run (the file sinks' run header) names this one, so every sink of one monitor names the same run."""

    def close(self):
        """Flushes and releases what the sink holds; the history calls it once, at the end."""

    def values(self, record):
        """(stat, value) of each of self.stats the record has (chosen_items)."""
        return chosen_items(record, self.stats)

    def name(self, record):
        """The name of a record's target on a dashboard, before the statistic (sinks/names.py)."""
        return record_name(record, self.prefix)

    def named_values(self, record):
        """(full dashboard name, value) of each of self.stats the record has."""
        base = self.name(record)
        return ((stat_name(base, stat), v) for stat, v in self.values(record))


def protocol(sink, method):
    """sink's `method` (write_steps, write_alerts, close), or Sink's for an object that is no Sink and lacks it:
    any object with write(step, records) and close() is a sink."""
    fn = getattr(sink, method, None)
    return fn if callable(fn) else getattr(Sink, method).__get__(sink)


def check_sinks(sinks):
    """attach(sinks=...): a list of sinks (one sink alone taken as a list), each a Sink or an object with
    write(step, records) and close()."""
    if sinks is None:
        return []
    if not isinstance(sinks, (list, tuple)):
        sinks = [sinks]
    for s in sinks:
        if isinstance(s, type):
            raise ValueError(f"a sink is an object, got the class {s.__name__}: pass one made of it, e.g. "
                             f"{s.__name__}(...)")
        if not isinstance(s, Sink) and not all(callable(getattr(s, m, None)) for m in ("write", "close")):
            raise ValueError(f"a sink is a hookstats.sinks.Sink, or an object with write(step, records) and close() "
                             f"methods; got {type(s).__name__}")
    return list(sinks)


def check_stats(stats):
    """The statistics a dashboard sink logs, checked: a tuple of names from DASHBOARD_CHOICES."""
    if isinstance(stats, str):
        stats = (stats,)
    stats = tuple(stats)
    bad = [s for s in stats if s not in DASHBOARD_CHOICES]
    if bad:
        raise ValueError(f"unknown statistic(s) {bad}; choose from {list(DASHBOARD_CHOICES)}")
    return stats


def check_prefix(prefix):
    if not isinstance(prefix, str):
        raise ValueError(f"prefix must be a string, got {prefix!r}")
    return prefix


def chosen_items(record, stats):
    """(stat, value) for each of `stats` present in the record (see check_stats). A figure of the histograms
    (statistics.HIST_FIGURES) that is NaN, not counted on this record, is left out: a dashboard gets no point and
    a file no field there, never a NaN that reads as a measurement."""
    for stat in stats:
        v = statistics.from_record(stat, record) if statistics.BY_NAME[stat].scope == statistics.SINKS \
            else record.get(stat)
        if v is None or (v != v and stat in HIST_FIGURES):
            continue
        yield stat, int(v) if isinstance(v, numbers.Integral) else float(v)


def json_number(v):
    """JSON has no NaN or Inf: they become null."""
    if v is None or isinstance(v, numbers.Integral):
        return None if v is None else int(v)
    v = float(v)
    return v if math.isfinite(v) else None


def open_parent(path, mode):
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, mode, newline="" if "b" not in mode else None, encoding=None if "b" in mode else "utf-8")


class SkippedLinesWarning(HistoryFileWarning):
    """A saved history file had lines that are not whole (a run that died while writing); the whole ones
    were read."""


def file_lines(path, bad, progress=None):
    """Yields (line number, text) of each whole line of a file a sink wrote, and appends to `bad` the
    numbers of the lines that are not: no line end (the line being written when the process died; a
    character torn there is in that line). Bytes that are not UTF-8 elsewhere read as U+FFFD. progress(n), where
    given: n characters more were read (the bytes, for an ASCII file), said every PROGRESS_CHARS and at the end."""
    done = 0
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        for n, line in enumerate(f, 1):
            if progress is not None:
                done += len(line)
                if done >= PROGRESS_CHARS:
                    progress(done)
                    done = 0
            if line.endswith("\n"):
                yield n, line.rstrip("\r\n")
            else:
                bad.append(n)
    if progress is not None and done:
        progress(done)


def warn_skipped(path, bad, read, what):
    """One warning for the lines of `path` that were skipped, if any; an error when no line was read (a file
    with nothing whole in it is not a torn one). what: what a skipped line is not ("JSON", "a CSV row")."""
    if not bad:
        return
    bad = sorted(bad)
    if not read:
        raise ValueError(f"{path}:{bad[0]}: not {what}; the file holds no whole record")
    where = ", ".join(map(str, bad[:5])) + (", ..." if len(bad) > 5 else "")
    warnings.warn(f"{path}: skipped {len(bad)} line(s) that are not whole records (line {where}); read the rest",
                  SkippedLinesWarning, stacklevel=3)
