"""flight_<step>.jsonl: a Flight (hookstats/flight.py) as a file beside a history file. The first line is the
flight (type "flight": the triggering alert's step, kind, target and message, every alert of its flush, its steps,
its targets in step order), then one line per step and target (type "stats": the KEY_FIELDS and the scalars, NaN
and Inf as null). Written whole to a temporary name and renamed, so a reader never sees half a flight; two sinks
of one folder write the same file. read_flight() loads it back for `hookstats report`."""
import json
import os
from pathlib import Path

import numpy as np

from ..flight import Flight
from ..phases import Phase
from ..records import KEY_FIELDS
from .base import json_number

PATTERN = "flight_*.jsonl"


def flight_path(folder, flight, stem_suffix=""):
    """The flight's file in `folder` (stem_suffix: ".rank<r>" for a rank r > 0)."""
    return Path(folder) / f"flight_{flight.step}{stem_suffix}.jsonl"


def write_flight_file(path, flight, run_id=None):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    head = {"type": "flight", "run": run_id, "step": flight.step, "kind": flight.kind, "target": flight.target,
            "message": flight.message, "steps": flight.steps, "targets": flight.targets,
            "alerts": [{k: json_number(v) if isinstance(v, float) else v for k, v in a.items()} for a in flight.alerts]}
    lines = [json.dumps(head, allow_nan=False)]
    for step, rec in flight.records():
        lines.append(json.dumps({"type": "stats", "step": step, **{k: rec[k] for k in KEY_FIELDS},
                                 **{k: json_number(rec[k]) for k in flight.columns}}, allow_nan=False))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_flight(path):
    """The Flight of a flight_<step>.jsonl file; a file that is not one is one ValueError naming it."""
    path = Path(path)
    try:
        objs = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a hookstats flight file ({e})") from None
    if not objs or not isinstance(objs[0], dict) or objs[0].get("type") != "flight":
        raise ValueError(f"{path}: not a hookstats flight file (its first line is no flight header)")
    head = objs[0]
    try:
        steps, targets = [int(s) for s in head["steps"]], [str(t) for t in head["targets"]]
        rows = [o for o in objs[1:] if isinstance(o, dict) and o.get("type") == "stats"]
        stats = list(dict.fromkeys(k for o in rows for k in o if k not in KEY_FIELDS and k not in ("type", "step")))
        columns = {k: np.full((len(steps), len(targets)), np.nan) for k in stats}
        present = np.zeros((len(steps), len(targets)), dtype=bool)
        keys = {t: {"target": t, "module": "", "kind": "", "leaf": "", "phase": Phase.TRAIN.value} for t in targets}
        s_ix, t_ix = {s: i for i, s in enumerate(steps)}, {t: i for i, t in enumerate(targets)}
        for o in rows:
            s, t = s_ix[int(o["step"])], t_ix[o["target"]]
            keys[o["target"]] = {k: o.get(k, "") for k in KEY_FIELDS}
            present[s, t] = True
            for k in stats:
                v = o.get(k)
                columns[k][s, t] = np.nan if v is None else float(v)
        return Flight(step=int(head["step"]), kind=str(head["kind"]), target=str(head["target"]),
                      message=str(head["message"]), alerts=list(head.get("alerts") or []), steps=steps,
                      keys=[keys[t] for t in targets], columns=columns, present=present)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: not a whole hookstats flight file ({type(e).__name__}: {e})") from None


def find_flights(folder):
    """The flight files of a run folder, by alert step."""
    def step_of(p):
        core = p.stem[len("flight_"):].split(".")[0]
        return int(core) if core.isdigit() else -1
    return sorted(Path(folder).glob(PATTERN), key=step_of)
