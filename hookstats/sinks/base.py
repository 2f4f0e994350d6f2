"""What every sink shares: the record format and the scalar statistics written per step.

A sink is any object with write(step, records) and close(); write_alerts(step, alerts) is optional.
records: one dict per target measured in that step (hookstats.history.step_record): target, module,
kind, leaf, the SCALARS, and NumPy arrays hist, hist_edges, log2_hist (None when switched off).
"""
import math
import numbers

SCALARS = ("count", "finite", "mean", "std", "near_zero", "nan", "posinf", "neginf", "underflow", "overflow",
           "running_min", "running_max")
KEY_FIELDS = ("target", "module", "kind", "leaf")


def scalar_items(record):
    """(stat, value) for each scalar statistic present in the record: counts as int, the rest as float."""
    for stat in SCALARS:
        v = record.get(stat)
        if v is not None:
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
