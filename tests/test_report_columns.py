"""The report's history read as columns (hookstats.sinks.Columns) against the test's own account of what a written
file holds: which (step, target) records stand after bad lines, a resumed run that writes steps again, a step a
killed process left incomplete, duplicates and validation passes, in a JSONL file and a CSV file; the series the
charts draw and the table's last records from the columns equal those the test expects, and the records
read_jsonl() hands out equal the columns' own."""
import json
import math
import warnings

import numpy as np
import pytest

from hookstats import statistics
from hookstats.record_reading import last_records
from hookstats.sinks import read_history_columns, read_jsonl
from hookstats.tools import plots

TARGETS = [("a:output", "a", "output"), ("a:grad_output", "a", "grad_output"), ("b:output", "b", "output")]


def line(step, target, module, kind, mean, phase="train", **more):
    return {"type": "stats", "step": step, "target": target, "module": module, "kind": kind, "leaf": "",
            "phase": phase, "count": 4, "finite": 4, "mean": mean, "std": abs(mean) / 2 + 0.25,
            "near_zero": 0.125, **more}


def written(path):
    """Writes a history with every case in it; returns {(target label, step): mean} of what must stand."""
    stands, lines = {}, []

    def put(step, t, phase="train", mean=None, keep=True, **more):
        target, module, kind = t
        mean = (hash((step, target, phase)) % 1000) / 100 - 5 if mean is None else mean
        lines.append(json.dumps(line(step, target, module, kind, mean, phase, **more)))
        label = target if phase == "train" else f"{target} ({phase})"
        if keep:
            stands[(label, step)] = mean
        return mean

    lines.append(json.dumps({"type": "run", "run": "first", "layout": {"version": 1, "float_slots": 4096,
                                                                       "log_slots": 256}}))
    for step in range(3):
        for t in TARGETS:
            put(step, t)
        if step == 1:
            put(step, TARGETS[0], phase="eval")
            lines.append(json.dumps({**line(1, "a:output", "a", "../../etc/passwd", 1.0)}))  # a kind as a path
            lines.append(json.dumps({**line(1, "b:output", "b", "output", 1.0), "mean": "1.0"}))
            lines.append(json.dumps({**line(1, "b:output", "b", "output", 1.0), "phase": "../x"}))
            lines.append('{"type": "stats", "step": 1, "tar')  # torn and glued to the next line
        lines.append(json.dumps({"type": "step_end", "step": step, "targets": 3}))
    for t in TARGETS[:2]:  # step 3: killed before its marker
        put(3, t, keep=False)
    lines.append(json.dumps({"type": "run", "run": "second", "layout": {"version": 1, "float_slots": 4096,
                                                                        "log_slots": 256}}))
    for step in (2, 3, 4):  # the resumed run writes step 2 again: the last written wins
        for t in TARGETS:
            put(step, t, near_zero_rel=None if step == 3 else 0.5)
        if step == 4:
            put(step, TARGETS[2], mean=7.5)  # written twice: the second stands
            put(step, TARGETS[0], phase="eval", nan=1)
        lines.append(json.dumps({"type": "step_end", "step": step, "targets": 3}))
    path.write_text("\n".join(lines) + "\n")
    return stands


def expected_series(stands):
    out = {}
    for (label, step), mean in sorted(stands.items(), key=lambda kv: kv[0][1]):
        out.setdefault(label, []).append((step, mean))
    return out


def test_jsonl_columns_match_what_stands(tmp_path):
    stands = written(tmp_path / "history.jsonl")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cols, _ = read_history_columns(tmp_path / "history.jsonl")
    said = [str(w.message) for w in caught]
    bad = [m for m in said if "line skipped" in m]
    assert [m.split(":")[1] for m in bad] == sorted((m.split(":")[1] for m in bad), key=int)  # in line order
    assert any("field 'kind'" in m for m in bad) and any("field 'phase'" in m for m in bad)
    assert any("field 'mean'" in m for m in bad)
    assert any("incomplete" in m for m in said) and any("2 runs" in m for m in said)
    assert any("written more than once" in m for m in said)
    assert "../../etc/passwd" not in cols.kinds and not any("../x" in t for t in cols.labels)

    series = plots.series_of(cols)
    want = expected_series(stands)
    assert list(series) == list(want)  # first seen, by step
    for label, pairs in want.items():
        s = series[label]
        np.testing.assert_array_equal(s["steps"], [st for st, _ in pairs])
        np.testing.assert_array_equal(s["mean"], [m for _, m in pairs])
        np.testing.assert_array_equal(s["std"], [abs(m) / 2 + 0.25 for _, m in pairs])
    rel = series["a:output"]["near_zero_rel"]  # null (step 3) and absent (steps 0, 1) are NaN
    assert math.isnan(rel[0]) and math.isnan(rel[3]) and rel[2] == 0.5

    rows, _ = last_records(cols)
    last = {r["target"]: r for r in rows}
    assert {t: r["mean"] for t, r in last.items()} == {label: pairs[-1][1] for label, pairs in want.items()}
    assert last["a:output (eval)"]["nan"] == 1 and type(last["a:output"]["count"]) is int


def test_read_jsonl_records_are_the_columns_records(tmp_path):
    written(tmp_path / "history.jsonl")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        items, _ = read_jsonl(tmp_path / "history.jsonl")
        cols, _ = read_history_columns(tmp_path / "history.jsonl")
    assert len(items) == len(cols)
    for i, (step, rec) in enumerate(items):
        assert step == cols.steps[i]
        for st in statistics.PLOTTED:
            v = rec.get(st.name)
            got = cols.numeric[st.name][i]
            assert (v is None or math.isnan(v)) and math.isnan(got) or v == got


def test_csv_columns_match_what_stands(tmp_path):
    rows = ["step,target,module,kind,leaf,phase,stat,value", "0,,,#run,r1,,run,nan"]
    stands = {}
    for step in range(3):
        for target, module, kind in TARGETS:
            mean = step * 10 + len(target)
            rows += [f"{step},{target},{module},{kind},,train,mean,{mean}", f"{step},{target},{module},{kind},,train,count,4"]
            stands[(target, step)] = mean
        rows.append(f"{step},,,#step_end,,,targets,3")
    rows.append("2,b:output,b,../etc,,train,mean,1.0")  # a kind as a path: skipped
    rows.append("3,b:output,b,output,,train,mean,99.0")  # after the last marker: incomplete, left out
    (tmp_path / "history.csv").write_text("\n".join(rows) + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cols, _ = read_history_columns(tmp_path / "history.csv")
    series = plots.series_of(cols)
    for label, pairs in expected_series(stands).items():
        np.testing.assert_array_equal(series[label]["mean"], [m for _, m in pairs])
    assert "../etc" not in cols.kinds


@pytest.mark.parametrize("kind", ["output", "grad_output"])
def test_collect_of_pairs_equals_the_columns(tmp_path, kind):
    written(tmp_path / "history.jsonl")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        items, _ = read_jsonl(tmp_path / "history.jsonl")
        cols, _ = read_history_columns(tmp_path / "history.jsonl")
    a, b = plots.collect(items), plots.series_of(cols)
    assert list(a) == list(b)
    for t in a:
        if a[t]["kind"] == kind:
            for k in ("steps", "mean", "std", "near_zero"):
                np.testing.assert_array_equal(a[t][k], b[t][k])
