"""JSONLSink: one JSON line per step and target (its "phase": "train", or "eval" for a validation pass, stamped
with the step it ran in) with the scalars and the histograms (the float buckets and
the log2 slots as {slot: count} of the occupied slots; the log2 ones also where there are buckets, a few dozen
entries that keep the files readable by versions without buckets; null beside the buckets with log_hist=False),
and one line per alert. Each run header names the state layout its slots are in (rawstate.LAYOUT). read_jsonl()
loads it back for `hookstats report`; files of versions without float buckets read as before, and a run of another
layout without its slots (LayoutWarning)."""
import functools
import json
import re
import warnings
from pathlib import Path

import numpy as np

from .. import layout, rawstate, records
from ..phases import Phase, record_phase
from . import claim, fields, jsonl_columns, purge
from .base import SCALARS, file_lines, json_number, open_parent, warn_skipped
from .runs import LayoutWarning, Ledger, run_header


class JSONLSink(claim.FileSink):
    """path: the file. Records are appended after a run header, each step's followed by a step-end marker (a
    resumed run keeps the earlier records of the steps before its own, resume()); one process writes a file at a
    time (claim.py), and under torch.distributed rank r > 0 writes `<stem>.rank<r>.jsonl`."""

    def __init__(self, path):
        super().__init__(path)
        self._file = None

    def _out(self):
        if self._file is None:
            path = self.claim()
            self._file = open_parent(path, "a")
            if self._file.tell() and not _ends_with_newline(path):
                self._file.write("\n")  # a torn last line stays one skipped line, not glued to the header
            self._file.write(json.dumps({"type": "run", **run_header(self.run_id), "layout": rawstate.LAYOUT}) + "\n")
        return self._file

    def write(self, step, records):
        f = self._out()
        for rec in records:
            line = {"type": "stats", "step": step, "target": rec["target"], "module": rec["module"],
                    "kind": rec["kind"], "leaf": rec["leaf"], "phase": record_phase(rec)}
            line.update((k, json_number(v)) for k, v in self.values(rec))
            if rec.get("hist") is not None:
                line["hist"] = [int(c) for c in rec["hist"]]
                line["hist_range"] = [float(rec["hist_edges"][0]), float(rec["hist_edges"][-1])]
            if rec.get("log2_hist") is not None:
                line["log2_hist"] = _sparse(rec["log2_hist"])
            if rec.get("float_hist") is not None:
                line["float_hist"] = _sparse(rec["float_hist"])
                if rec.get("log2_hist") is None:  # log_hist=False: read_jsonl must not sum it from the buckets
                    line["log2_hist"] = None
            f.write(json.dumps(line, allow_nan=False) + "\n")
        f.write(json.dumps({"type": "step_end", "step": step, "targets": len(records)}) + "\n")
        f.flush()

    def write_alerts(self, step, alerts):
        f = self._out()
        for a in alerts:
            f.write(json.dumps({"type": "alert", **{k: json_number(v) if isinstance(v, float) else v
                                                     for k, v in a.items()}}, allow_nan=False) + "\n")
        f.flush()

    def superseded(self, path):
        return [(path, _step_of)]

    def close_files(self):
        f, self._file = self._file, None
        if f is not None:
            f.close()


_STEP = re.compile(r'\{"type": "\w+", "step": (\d+)[,}]')  # how write() begins a stats or step_end line


def _step_of(line):
    """The step of a line of a JSONLSink file (purge.drop_steps_from), RUN for a run header."""
    m = _STEP.match(line)
    if m:
        return int(m.group(1))
    if line.startswith('{"type": "run"'):
        return purge.RUN
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None
    step = obj.get("step") if isinstance(obj, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _ends_with_newline(path):
    with open(path, "rb") as f:
        f.seek(-1, 2)
        return f.read(1) == b"\n"


def _sparse(counts):
    nz = np.flatnonzero(counts)
    return {str(int(k)): int(counts[k]) for k in nz}


def _dense(sparse, size, what):
    if not isinstance(sparse, dict):
        raise fields.BadField(what, f"must be an object of slot: count, got {fields.show(sparse)}")
    out = np.zeros(size, dtype=np.int64)
    if sparse and all(k.isdigit() and len(k) < 6 for k in sparse) and \
            all(type(c) is int and 0 <= c <= fields.INT64_MAX for c in sparse.values()):
        slots = np.fromiter(map(int, sparse), np.int64, len(sparse))
        if slots.max() < size:  # every slot and count valid: one vectorized store
            out[slots] = np.fromiter(sparse.values(), np.int64, len(sparse))
            return out
    for k, c in sparse.items():
        if not (k.isdigit() and int(k) < size):
            raise fields.BadField(what, f"slot {fields.show(k)} outside 0..{size - 1}")
        out[int(k)] = fields.count(c, f"{what}[{k}]")
    return out


def read_jsonl(path):
    """(step, record) pairs (histograms back as NumPy arrays, null back to NaN) and the alerts. Lines that
    are not whole JSON (a run that died while writing) are skipped with one SkippedLinesWarning per file; a
    whole line that is not a valid record with one BadRecordWarning naming the field (fields.py). Runs,
    duplicates and incomplete steps: runs.Ledger (the last written record of a (step, target) wins). A run whose
    header names another state layout is read without its slots, with one LayoutWarning per such run."""
    cols, alerts = read_jsonl_columns(path)
    return cols.items(), alerts


def read_jsonl_columns(path, progress=None):
    """read_jsonl() as (columns.Columns, alerts), with the same checks and warnings: the lines of records (scalars,
    log2 histograms and float buckets: all but a fixed-range histogram's) are kept as their values and checked a
    field at a time over all of them (jsonl_columns.py); a line that fails a check is read as one record.
    progress(n): n more characters of the file read (base.file_lines)."""
    path = Path(path)
    ledger, lines = Ledger(path), fields.BadLines(path)
    plain = jsonl_columns.PlainLines(_plan, ledger)
    alerts, bad, read, names, notes = [], [], 0, {}, []
    other, unread = None, {}  # why the current run's slots cannot be read (None: they can); run -> why
    for n, line in file_lines(path, bad, progress):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            bad.append(n)  # torn, or torn and glued to the next line
            continue
        except RecursionError:
            deep = re.search(r'"([^"\\]{1,100})":\s*[\[{]{100}', line)
            notes.append((n, (f"field {deep.group(1)!r}: " if deep else "") + "JSON nested too deep to read"))
            continue
        except ValueError as e:  # an integer of more digits than Python converts
            notes.append((n, f"not readable JSON ({e})"))
            continue
        kind = obj.get("type") if isinstance(obj, dict) else None
        try:
            if kind == "stats":
                if other is None and plain.take(n, obj):
                    continue  # counted as read once its fields are checked
                if other is not None:
                    obj = {k: v for k, v in obj.items() if k not in SLOT_FIELDS}
                ledger.record(*_record(obj, lines, names))
            elif kind == "alert":
                alerts.append(_alert(obj))
            elif kind == "run":
                run = fields.name(obj.get("run"), "run")
                other = rawstate.other_layout(obj.get("layout"))
                if other is not None:
                    unread.setdefault(run, other)
                ledger.start_run(run)
            elif kind == "step_end":
                ledger.step_end(fields.step(obj.get("step")))
            else:
                got = "missing" if isinstance(obj, dict) and "type" not in obj else \
                    f"got {fields.show(kind)}" if isinstance(obj, dict) else f"the line is a JSON {type(obj).__name__}"
                raise fields.BadField("type", f"must be 'stats', 'alert', 'run' or 'step_end': {got}")
        except ValueError as e:
            notes.append((n, str(e)))
            continue
        read += 1
    flagged, checked = plain.check(lambda obj: _record(obj, lines, names), lines, names)
    read += checked
    for n, why in sorted(notes + flagged):
        lines.add(n, why)
    if not read and lines.n and not bad:
        raise ValueError(f"{path}: not a hookstats JSONL history (no line is a hookstats record)")
    warn_skipped(path, bad, read, "JSON")
    for run, why in unread.items():
        warnings.warn(f"{path}: run {run}: {why}: its log2 histograms and float buckets are left out, its other "
                      f"statistics read", LayoutWarning, stacklevel=2)
    lines.finish()
    return plain.columns(lambda obj, slots=None: _record(obj, lines, names, slots)[1]), alerts


KEYS = ("target", "module", "kind", "leaf")
_NOT_SCALARS = frozenset(KEYS) | {"type", "step", "hist", "hist_range", "log2_hist", "float_hist"}
_SCALARS = frozenset(SCALARS)  # sets: a history has a million fields to look up
SLOT_FIELDS = ("log2_hist", "float_hist")  # what a record holds in the state layout's slots


_FLOAT, _COUNT, _SCALAR, _OTHER = "float", "count", "scalar", "other"


@functools.lru_cache(maxsize=1024)
def _plan(keys):
    """(field, how it is checked) of a record's fields other than its keys and histograms, in the line's order: a
    history's lines share a few key sets, so each field's check is looked up once per set, not once per line."""
    def how(k):
        if k not in _SCALARS:
            return _OTHER
        return _FLOAT if k not in fields.COUNTS else _COUNT if k in fields.INT_COUNTS else _SCALAR
    return tuple((k, how(k)) for k in keys if k not in _NOT_SCALARS)


def _alert(obj):
    out = {k: v for k, v in obj.items() if k != "type"}
    for k in ("kind", "message"):
        if not isinstance(out.get(k), str):
            raise fields.BadField(k, "missing" if k not in out else f"must be a string, got {fields.show(out[k])}")
    fields.alert_kind(out["kind"])
    out["step"] = fields.step(out.get("step"))
    out["target"] = fields.name(out.get("target", ""), "target")
    return out


def _record(obj, lines, names=None, slots=None):
    """names: {(field, value): checked value} shared by a file's records (a target's name recurs every step);
    slots: {"log2_hist" / "float_hist": the line's counts, already checked and made dense} (jsonl_columns.py), in
    place of reading those fields of obj."""
    out = {}
    step = fields.step(obj.get("step"))
    names = {} if names is None else names
    for k in KEYS:
        if k == "target" or k in obj:
            v = obj.get(k)
            got = names.get((k, v)) if type(v) is str else None
            if got is None:
                got = names[(k, v)] = fields.key(v, k, lines)  # raises unless v is a valid str
            out[k] = got
        else:
            out[k] = ""
    out["phase"] = fields.key(obj.get("phase", Phase.TRAIN), "phase")  # files of versions without phases
    log2_off = "log2_hist" in obj and obj["log2_hist"] is None  # written with log_hist=False
    for k, how in _plan(tuple(obj)):
        v = obj[k]
        if how is _FLOAT and type(v) is float or how is _COUNT and type(v) is int and 0 <= v <= fields.EXACT:
            out[k] = v  # what json.loads gives for almost every field: settled as fields.scalar would
        elif how is not _OTHER:
            out[k] = fields.scalar(k, v)
        elif isinstance(v, str):  # a field of a later version (e.g. a phase name): kept when plain
            out[k] = fields.name(v, k, lines)
        elif v is None or isinstance(v, (int, float)) and not isinstance(v, bool):
            try:
                out[k] = fields.scalar(k, v)
            except ValueError:
                pass  # a value the report cannot use: left out
    if "hist" in obj:
        h = obj["hist"]
        if not isinstance(h, list) or not h:
            raise fields.BadField("hist", f"must be a list of counts, got {fields.show(h)}")
        out["hist"] = np.array([fields.count(c, "hist") for c in h], dtype=np.int64)
        rng = obj.get("hist_range")
        if not (isinstance(rng, list) and len(rng) == 2):
            raise fields.BadField("hist_range", f"must be [lo, hi], got {fields.show(rng)}")
        lo, hi = (fields.scalar("hist_range", v) for v in rng)
        if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
            raise fields.BadField("hist_range", f"must be finite with lo < hi, got {rng}")
        out["hist_edges"] = np.linspace(lo, hi, len(h) + 1)
    slots = {} if slots is None else slots
    if log2_off:
        out["log2_hist"] = None
    elif "log2_hist" in obj:
        out["log2_hist"] = slots.get("log2_hist")
        if out["log2_hist"] is None:
            out["log2_hist"] = _dense(obj["log2_hist"], layout.LOG_SLOTS, "log2_hist")
    if "float_hist" in obj:
        out["float_hist"] = slots.get("float_hist")
        if out["float_hist"] is None:
            out["float_hist"] = _dense(obj["float_hist"], layout.FLOAT_SLOTS, "float_hist")
    return step, records.record(out)
