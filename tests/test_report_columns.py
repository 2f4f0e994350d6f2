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


def read_saying(path):
    """The history's columns, every warning the reading said, and the notes of the lines it skipped."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cols, _ = read_history_columns(path)
    said = [str(w.message) for w in caught]
    return cols, said, [m for m in said if "line skipped" in m]


def test_jsonl_columns_match_what_stands(tmp_path):
    stands = written(tmp_path / "history.jsonl")
    cols, said, bad = read_saying(tmp_path / "history.jsonl")
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


LOG_SLOTS, FLOAT_SLOTS = 256, 4096


def hist_written(path):
    """A history whose lines carry histograms (log2 slots with and without float buckets, log_hist=False's null,
    a fixed-range histogram) among every bad case; returns {(label, step): {field: dense counts or None}} of the
    records that must stand, from the test's own reading of the slots it wrote."""
    stands, lines = {}, []

    def put(step, t, phase="train", keep=True, log2=True, floats=False, linear=False, **more):
        target, module, kind = t
        rng = np.random.default_rng(abs(hash((step, target, phase, len(lines)))) % 2 ** 32)
        want, rec = {}, line(step, target, module, kind, 0.5, phase, hist_count=8.0, **more)
        if log2 is not None:
            slots = sorted(set(rng.integers(0, LOG_SLOTS, 5).tolist()))
            rec["log2_hist"] = {str(s): int(c) for s, c in zip(slots, rng.integers(1, 9, len(slots)))}
        else:
            rec["log2_hist"] = None
        if floats:
            slots = sorted(set(rng.integers(0, FLOAT_SLOTS, 7).tolist()))
            rec["float_hist"] = {str(s): int(c) for s, c in zip(slots, rng.integers(1, 2 ** 40, len(slots)))}
        if linear:
            rec["hist"], rec["hist_range"] = [1, 2, 3, 4], [-1.0, 1.0]
        for k, size in (("log2_hist", LOG_SLOTS), ("float_hist", FLOAT_SLOTS)):
            if rec.get(k) is not None:
                dense = np.zeros(size, np.int64)
                for s, c in rec[k].items():
                    dense[int(s)] = c
                want[k] = dense
        lines.append(json.dumps(rec))
        label = target if phase == "train" else f"{target} ({phase})"
        if keep:
            stands[(label, step)] = want
        return rec

    run = {"version": 1, "float_slots": FLOAT_SLOTS, "log_slots": LOG_SLOTS}
    lines.append(json.dumps({"type": "run", "run": "first", "layout": run}))
    for step in range(3):
        for t in TARGETS:
            put(step, t, floats=step == 2, log2=None if (step, t) == (2, TARGETS[1]) else True)
        if step == 1:
            put(step, TARGETS[0], phase="eval", floats=True)
            bad = put(step, TARGETS[1], keep=False, floats=True)
            lines[-1] = json.dumps({**bad, "kind": "../../etc/passwd"})  # a kind as a path
            bad = put(step, TARGETS[2], keep=False, floats=True)
            lines[-1] = json.dumps({**bad, "float_hist": {"4096": 1}})  # a slot outside the buckets
            bad = put(step, TARGETS[2], keep=False)
            lines[-1] = json.dumps({**bad, "log2_hist": {"1": -3}})  # a negative count
            bad = put(step, TARGETS[2], keep=False)
            lines[-1] = json.dumps({**bad, "log2_hist": {"x1": 3}})  # a slot that is not a number
            bad = put(step, TARGETS[2], keep=False, floats=True)
            lines[-1] = json.dumps({**bad, "float_hist": None})
            bad = put(step, TARGETS[0], keep=False, floats=True)
            lines[-1] = json.dumps({**bad, "phase": "../x"})
            bad = put(step, TARGETS[0], keep=False, floats=True)
            lines[-1] = json.dumps({**bad, "hist_count": 2.5})
            lines.append('{"type": "stats", "step": 1, "target": "a:output", "log2_hist": {"1": ')  # torn
        lines.append(json.dumps({"type": "step_end", "step": step, "targets": 3}))
    put(3, TARGETS[0], keep=False, floats=True)  # killed before its marker
    lines.append(json.dumps({"type": "run", "run": "second", "layout": run}))
    for step in (2, 3):  # the resumed run writes step 2 again: the last written wins
        for t in TARGETS:
            put(step, t, floats=t is TARGETS[0], linear=t is TARGETS[2] and step == 3)
        if step == 3:
            put(step, TARGETS[1], floats=True)  # written twice: the second stands
            put(step, TARGETS[0], phase="eval", floats=True)
        lines.append(json.dumps({"type": "step_end", "step": step, "targets": 3}))
    path.write_text("\n".join(lines) + "\n")
    return stands


def test_histogram_lines_read_as_written(tmp_path):
    stands = hist_written(tmp_path / "history.jsonl")
    cols, said, bad = read_saying(tmp_path / "history.jsonl")
    for field in ("'kind'", "'float_hist'", "'log2_hist'", "'phase'", "'hist_count'"):
        assert any(f"field {field}" in m for m in bad), field
    assert len(bad) == 7 and any("not whole records" in m for m in said)  # the torn line
    assert "../../etc/passwd" not in cols.kinds and not any("../x" in t for t in cols.labels)
    assert len(cols.built) == 1  # only the fixed-range histogram's line was read as one record
    hists = [cols.histograms(i) for i in range(len(cols))]  # before any record is made
    assert len(cols.built) == 1

    got = {}
    for label, rows in zip(cols.labels, cols.rows_by_label()):
        for i in rows.tolist():
            got[(label, int(cols.steps[i]))] = cols.record(i)
    assert set(got) == set(stands)
    for key, want in stands.items():
        rec = got[key]
        assert cols.has_hist[[i for i in range(len(cols)) if (cols.labels[cols.label[i]], cols.steps[i]) == key][0]]
        for k, size in (("log2_hist", LOG_SLOTS), ("float_hist", FLOAT_SLOTS)):
            if k in want:
                assert rec[k].dtype == np.int64 and rec[k].shape == (size,), (key, k)
                np.testing.assert_array_equal(rec[k], want[k], err_msg=str((key, k)))
            elif k == "float_hist":
                assert rec.get(k) is None, (key, k)
        if "log2_hist" not in want:
            assert rec["log2_hist"] is None  # log_hist=False: not summed from anything
        assert type(rec["count"]) is int and rec["hist_count"] == 8.0
    for i, h in enumerate(hists):  # the histograms without the record are the record's
        rec = cols.record(i)
        for k in ("hist", "log2_hist", "float_hist"):
            assert (h[k] is None) == (rec.get(k) is None), (i, k)
            if h[k] is not None:
                np.testing.assert_array_equal(h[k], rec[k])
    linear = got[("b:output", 3)]
    np.testing.assert_array_equal(linear["hist"], [1, 2, 3, 4])
    np.testing.assert_array_equal(linear["hist_edges"], np.linspace(-1, 1, 5))

    series = plots.series_of(cols)
    for label in ("a:output", "a:output (eval)"):
        steps = sorted(st for (lb, st), w in stands.items() if lb == label and "float_hist" in w)
        np.testing.assert_array_equal(series[label]["float_view_steps"], steps)
        total = sum(stands[(label, st)]["float_hist"] for st in steps)
        np.testing.assert_array_equal(series[label]["float_total"], total)
