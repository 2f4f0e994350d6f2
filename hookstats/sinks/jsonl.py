"""JSONLSink: one JSON line per step and target (its "phase": "train", or "eval" for a validation pass, stamped
with the step it ran in) with the scalars and the histograms (the float buckets and
the log2 slots as {slot: count} of the occupied slots; the log2 ones also where there are buckets, a few dozen
entries that keep the files readable by versions without buckets; null beside the buckets with log_hist=False),
and one line per alert. read_jsonl() loads it back for `hookstats report`; files of versions without float
buckets read as before."""
import json
from pathlib import Path

import numpy as np

from .. import buckets, layout
from .base import file_lines, json_number, open_parent, scalar_items, warn_skipped


class JSONLSink:
    def __init__(self, path):
        self.path = Path(path)
        self._file = None

    def _out(self):
        if self._file is None:
            self._file = open_parent(self.path, "w")
        return self._file

    def write(self, step, records):
        f = self._out()
        for rec in records:
            line = {"type": "stats", "step": step, "target": rec["target"], "module": rec["module"],
                    "kind": rec["kind"], "leaf": rec["leaf"], "phase": rec.get("phase") or "train"}
            line.update((k, json_number(v)) for k, v in scalar_items(rec))
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
        f.flush()

    def write_alerts(self, step, alerts):
        f = self._out()
        for a in alerts:
            f.write(json.dumps({"type": "alert", **{k: json_number(v) if isinstance(v, float) else v
                                                     for k, v in a.items()}}, allow_nan=False) + "\n")
        f.flush()

    def close(self):
        if self._file is not None:
            self._file.close()
            self._file = None


def _sparse(counts):
    nz = np.flatnonzero(counts)
    return {str(int(k)): int(counts[k]) for k in nz}


def _dense(sparse, size, what):
    out = np.zeros(size, dtype=np.int64)
    for k, c in sparse.items():
        if not 0 <= int(k) < size:
            raise IndexError(f"{what} slot {k} outside 0..{size - 1}")
        if isinstance(c, bool) or not isinstance(c, int) or c < 0:
            raise ValueError(f"{what} slot {k} holds {c!r}, not a count")
        out[int(k)] = c
    return out


def read_jsonl(path):
    """(step, record) pairs (histograms back as NumPy arrays, null back to NaN) and the alerts. Lines that
    are not whole JSON (a run that died while writing) are skipped with one SkippedLinesWarning per file;
    a whole line that is not a hookstats record is an error."""
    items, alerts, bad = [], [], []
    for n, line in file_lines(path, bad):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            bad.append(n)
            continue
        kind = obj.pop("type", None) if isinstance(obj, dict) else None
        if kind == "alert":
            alerts.append(obj)
            continue
        if kind != "stats" or "step" not in obj or "target" not in obj:
            raise ValueError(f"{path}:{n}: not a hookstats JSONL record")
        try:
            items.append(_record(obj))
        except (TypeError, ValueError, IndexError, KeyError, AttributeError) as e:
            raise ValueError(f"{path}:{n}: malformed hookstats record ({type(e).__name__}: {e})") from None
    warn_skipped(path, bad, len(items) + len(alerts), "JSON")
    return items, alerts


def _record(obj):
    step = obj.pop("step")
    obj.setdefault("phase", "train")  # files of versions without phases
    if isinstance(step, bool) or not isinstance(step, int) or not isinstance(obj["target"], str):
        raise TypeError(f"step must be an integer and target a string, got {step!r} and {obj['target']!r}")
    log2_off = "log2_hist" in obj and obj["log2_hist"] is None  # written with log_hist=False
    for k, v in obj.items():
        if v is None:
            obj[k] = float("nan")
    if "hist" in obj:
        obj["hist"] = np.asarray(obj["hist"], dtype=np.int64)
        lo, hi = obj.pop("hist_range")
        obj["hist_edges"] = np.linspace(float(lo), float(hi), len(obj["hist"]) + 1)
    if log2_off:
        obj["log2_hist"] = None
    elif "log2_hist" in obj:
        obj["log2_hist"] = _dense(obj["log2_hist"], layout.LOG_SLOTS, "log2")
    if "float_hist" in obj:
        obj["float_hist"] = _dense(obj["float_hist"], layout.FLOAT_SLOTS, "float bucket")
        if "log2_hist" not in obj:
            obj["log2_hist"] = buckets.log2_hist(obj["float_hist"])
    return step, obj
