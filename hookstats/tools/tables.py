"""The plain-text tables of the command line: stats_table() (one line per target, for the demo and `hookstats
report`), format_table() (any rows; summary() and the planner print theirs with it) and head_and_tail() (the first
and last rows of a long one). No torch here: `hookstats report` prints them without importing it."""
import math

from ..names import short
from ..records import value


def format_number(v):
    if v is None:
        return "-"
    if isinstance(v, bool) or isinstance(v, str):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if math.isnan(v):
        return "nan"
    return f"{v:.4g}"


def format_table(rows, columns, title=None):
    """A plain-text table with right-aligned numbers."""
    cells = [[format_number(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    numeric = [all(isinstance(r.get(c), (int, float)) or r.get(c) is None for r in rows) for c in columns]

    def line(vals):
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(vals, widths, numeric)).rstrip()

    out = ([title] if title else []) + [line(columns), line(["-" * w for w in widths])] + [line(c) for c in cells]
    return "\n".join(out)


def head_and_tail(table, n, note):
    """format_table()'s text with only its first and last n rows (more than 2n + 10 rows), the rows between them
    one line saying how many and `note` (e.g. where the whole table is); a table of fewer rows whole."""
    lines = table.splitlines()
    top = next(i for i, ln in enumerate(lines) if ln and set(ln) <= {"-", " "}) + 1  # the rule under the header
    rows = len(lines) - top
    if rows <= 2 * n + 10:
        return table
    cut = f"... {rows - 2 * n:,} of {rows:,} rows left out here; {note}"
    return "\n".join(lines[: top + n] + [cut] + lines[-n:])


# from the float buckets: the relative near-zero figure (hookstats/buckets.py) and quantiles of |x|
FLOAT_CELLS = {"near 0 rel %": ("near_zero_rel", 100), "p1 |x|": ("abs_p1", 1), "p50 |x|": ("abs_p50", 1),
               "p99 |x|": ("abs_p99", 1)}


def float_cells(rec):
    """The FLOAT_CELLS of a record (None where it has no float buckets)."""
    rec = rec or {}
    return {c: None if rec.get(k) is None else scale * rec[k] for c, (k, scale) in FLOAT_CELLS.items()}


def float_columns(rows):
    """FLOAT_CELLS' columns when some row has them (a monitor with float buckets, a run saved with them)."""
    return list(FLOAT_CELLS) if any(r.get(c) is not None for r in rows for c in FLOAT_CELLS) else []


def stats_table(records, title=None):
    """One line per target from stats() values or history records: mean, std, rms and L2 norm (of the finite
    values), near-zero % (|x| <= eps), with
    float buckets the relative near-zero % and the p1/p50/p99 of |x|, then min, max, non-finite count."""
    rows = []
    for rec in records:
        near_zero, nonfinite = value(rec, "near_zero"), value(rec, "nonfinite")
        rows.append({"target": short(rec["target"]),
                     **{k: value(rec, k) for k in ("count", "mean", "std", "rms", "l2")},
                     "near zero %": None if near_zero is None else 100 * near_zero, **float_cells(rec),
                     "min": value(rec, "min"), "max": value(rec, "max"), "nan/inf": int(nonfinite or 0)})
    return format_table(rows, ["target", "count", "mean", "std", "rms", "l2", "near zero %", *float_columns(rows), "min", "max",
                               "nan/inf"], title)
