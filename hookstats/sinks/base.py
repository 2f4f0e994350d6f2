"""What every sink shares: the record format and the scalar statistics written per step.

A sink is any object with write(step, records) and close(); write_alerts(step, alerts) is optional.
records: one dict per target measured in that step (hookstats.records.step_records): the KEY_FIELDS
target, module, kind, leaf, then the statistics of hookstats.statistics.TABLE that history records have
(histograms as NumPy arrays, None when switched off). Which of them the sinks write (SCALARS) and the
dashboards get (DASHBOARD_STATS by default, any of DASHBOARD_CHOICES) is said in that table.
"""
import math
import numbers
import warnings

from .. import statistics
from ..records import KEY_FIELDS  # noqa: F401 (the record format, here with the rest of it)
from ..statistics import DASHBOARD_CHOICES, DASHBOARD_STATS, HIST_FIGURES, SCALARS
from .names import PREFIX  # noqa: F401 (the default prefix of every dashboard name)
from .runs import HistoryFileWarning


def scalar_items(record):
    """(stat, value) for each scalar statistic present in the record: counts as int, the rest as float."""
    return chosen_items(record, SCALARS)


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


def file_lines(path, bad):
    """Yields (line number, text) of each whole line of a file a sink wrote, and appends to `bad` the
    numbers of the lines that are not: no line end (the line being written when the process died; a
    character torn there is in that line). Bytes that are not UTF-8 elsewhere read as U+FFFD."""
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        for n, line in enumerate(f, 1):
            if line.endswith("\n"):
                yield n, line.rstrip("\r\n")
            else:
                bad.append(n)


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
