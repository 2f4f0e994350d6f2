"""`hookstats report` on files it did not write whole: hostile lines (one warning naming file, line and field,
the line skipped, the rest read), very long target names (bounded cost), steps a killed process left
incomplete, several runs and duplicates in one file."""
import json
import shutil

import numpy as np
import pytest
import torch
from torch import nn

import hookstats
from hookstats.tools import cli
from hookstats.sinks import JSONLSink, run_dir_sinks
from helpers import draw_nothing

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")  # no NumPy warning may leak


def saved_run(run, steps=5):
    """A run folder written by attach(sinks=run_dir_sinks(...)), and the test's own float64 values of 0:output
    per step."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 3))
    seen = []
    model[0].register_forward_hook(lambda m, i, o: seen.append(o.detach().double().flatten().numpy()))
    mon = hookstats.attach(model, sinks=run_dir_sinks(run, tensorboard=False), log_every=3, alerts=False,
                           grads=False)
    for s in range(steps):
        model(torch.randn(4, 5) * (1 + s))
    mon.remove()
    return seen


def report(capsys, run, tmp_path):
    code = cli.main(["report", str(run), "--out", str(tmp_path / "charts")])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err.strip().splitlines()


def table_row(out, target):
    return next(ln for ln in out.splitlines() if ln.startswith(target + " ")).split()


GOOD = {"type": "stats", "step": 1, "target": "0:output", "module": "0", "kind": "output", "leaf": "", "count": 24,
        "finite": 24, "mean": 0.5, "std": 1.0}
DEEP = '{"type": "stats", "step": 1, "target": "0:output", "mean": ' + "[" * 50_000 + "]" * 50_000 + "}"
HOSTILE = {  # id: (line, the field the warning names)
    "list-for-a-number": (json.dumps({**GOOD, "mean": [1, 2]}), "mean"),
    "dict-for-a-number": (json.dumps({**GOOD, "std": {"a": 1}}), "std"),
    "bool-for-a-number": (json.dumps({**GOOD, "mean": True}), "mean"),
    "bin-count-1e20": (json.dumps({**GOOD, "float_hist": {"5": 10 ** 20}}), "float_hist[5]"),
    "huge-int-mean": (json.dumps({**GOOD, "mean": 10 ** 400}), "mean"),
    "400-digit-step": (json.dumps({**GOOD, "step": 10 ** 400}), "step"),
    "negative-step": (json.dumps({**GOOD, "step": -1}), "step"),
    "nested-50000": (DEEP, "mean"),
    "alert-without-kind": (json.dumps({"type": "alert", "step": 1, "target": "0:output", "message": "x"}), "kind"),
    "alert-kind-a-list": (json.dumps({"type": "alert", "step": 1, "target": "0:output", "kind": [],
                                      "message": "x"}), "kind"),
    "negative-count": (json.dumps({**GOOD, "count": -5}), "count"),
    "string-count": (json.dumps({**GOOD, "count": "5"}), "count"),
    "fractional-count": (json.dumps({**GOOD, "nan": 1.5}), "nan"),
    "infinite-count": ('{"type": "stats", "step": 1, "target": "0:output", "count": Infinity}', "count"),
    "negative-bin": (json.dumps({**GOOD, "log2_hist": {"3": -1}}), "log2_hist[3]"),
    "bin-slot-not-a-number": (json.dumps({**GOOD, "log2_hist": {"x": 1}}), "log2_hist"),
    "bins-a-list": (json.dumps({**GOOD, "float_hist": [1, 2]}), "float_hist"),
    "linear-bins-strings": (json.dumps({**GOOD, "hist": ["a"], "hist_range": [0, 1]}), "hist"),
    "linear-range-reversed": (json.dumps({**GOOD, "hist": [1], "hist_range": [1, 0]}), "hist_range"),
    "target-a-number": (json.dumps({**GOOD, "target": 5}), "target"),
    "no-target": (json.dumps({k: v for k, v in GOOD.items() if k != "target"}), "target"),
    "type-unknown": (json.dumps({**GOOD, "type": "x"}), "type"),
    "kind-a-path": (json.dumps({**GOOD, "kind": "x/../../../../tmp/EVIL"}), "kind"),
    "target-a-terminal-escape": (json.dumps({**GOOD, "target": "0:output\x1b[2J"}), "target"),
    "kind-unknown": (json.dumps({**GOOD, "kind": "weights"}), "kind"),
    "phase-unknown": (json.dumps({**GOOD, "phase": "test"}), "phase"),
    "phase-a-path": (json.dumps({**GOOD, "phase": "../x"}), "phase"),
    "alert-kind-unknown": (json.dumps({"type": "alert", "step": 1, "target": "0:output", "kind": "../x",
                                       "message": "x"}), "kind"),
    "a-json-list": ("[1, 2]", "type"),
}


def as_text(loaded):
    """What load_run read of a run (its records in order, its alerts) as one comparable text."""
    items, alerts = loaded
    return json.dumps([items.items(), alerts], sort_keys=True, default=lambda a: a.tolist())


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory):
    """A saved run (saved_run), the test's own values of 0:output per step, and what the report reads of its
    history.jsonl and, alone, of its history.csv: each hostile line's test reads a copy with the line put in."""
    run = tmp_path_factory.mktemp("clean") / "run"
    seen = saved_run(run)
    csv_only = run.parent / "csv_only"
    shutil.copytree(run, csv_only)
    (csv_only / "history.jsonl").unlink()
    return run, seen, as_text(cli.load_run(run, pytest.fail)), as_text(cli.load_run(csv_only, pytest.fail))


def with_line(clean, tmp_path, name, line, newline="\n", drop=None):
    """A copy of the clean run folder whose file `name` holds `line` as its 4th line (without file `drop`)."""
    run = tmp_path / "run"
    shutil.copytree(clean, run)
    if drop:
        (run / drop).unlink()
    path = run / name
    lines = path.read_text().splitlines()
    lines.insert(3, line)
    path.write_text(newline.join(lines) + newline)
    return run, path


# Each hostile line is read alone (load_run, what the report reads): what is read equals the clean run's whole.
# test_hostile_lines_through_the_report_command takes ten of them through the whole command, charts included.
@pytest.mark.parametrize("case", list(HOSTILE), ids=list(HOSTILE))
def test_a_hostile_jsonl_line_is_one_warning_naming_it_and_the_rest_is_read(tmp_path, clean_run, case):
    clean, _, read_clean, _ = clean_run
    run, path = with_line(clean, tmp_path, "history.jsonl", HOSTILE[case][0])
    said = []
    read = as_text(cli.load_run(run, said.append))
    assert said == [f"hookstats report: warning: {path}:4: field '{HOSTILE[case][1]}': " + said[0].split("': ", 1)[1]]
    assert said[0].endswith("; line skipped"), said
    assert read == read_clean


THROUGH_THE_COMMAND = ["dict-for-a-number", "400-digit-step", "nested-50000", "alert-kind-a-list", "infinite-count",
                       "bins-a-list", "linear-range-reversed", "kind-a-path", "target-a-terminal-escape",
                       "a-json-list"]


def test_hostile_lines_through_the_report_command(tmp_path, capsys, clean_run):
    """Ten hostile lines in one file through `hookstats report`: each one warning naming its line and field, the
    rest read, charts and table made of it."""
    clean, seen, _, _ = clean_run
    run = tmp_path / "run"
    shutil.copytree(clean, run)
    path = run / "history.jsonl"
    lines = path.read_text().splitlines()
    lines[3:3] = [HOSTILE[case][0] for case in THROUGH_THE_COMMAND]
    path.write_text("\n".join(lines) + "\n")
    code, out, err = report(capsys, run, tmp_path)
    assert code == 0
    assert len(err) == len(THROUGH_THE_COMMAND), err
    for n, (case, e) in enumerate(zip(THROUGH_THE_COMMAND, err)):
        assert e.startswith(f"hookstats report: warning: {path}:{4 + n}: field '{HOSTILE[case][1]}': "), e
        assert e.endswith("; line skipped"), e
    assert "5 recorded steps (0..4)" in out
    row = table_row(out, "0:output")
    assert int(row[1]) == seen[-1].size and float(row[2]) == pytest.approx(seen[-1].mean(), rel=1e-3)
    assert len(list((tmp_path / "charts").glob("*.png"))) > 0


CSV_HOSTILE = {
    "400-digit-step": ("1" * 400 + ",0:output,0,output,,train,count,24", "step"),
    "string-step": ("one,0:output,0,output,,train,count,24", "step"),
    "negative-count": ("1,0:output,0,output,,train,count,-5", "count"),
    "fractional-count": ("1,0:output,0,output,,train,nan,0.5", "nan"),
    "count-1e400": ("1,0:output,0,output,,train,finite,1e400", "finite"),
    "stat-named-target": ("1,0:output,0,output,,train,target,1", "stat"),
    "kind-a-path": ("1,0:output,0,x/../../../../tmp/EVIL,,train,count,24", "kind"),
    "phase-unknown": ("1,0:output,0,output,,test,count,24", "phase"),
}


@pytest.mark.parametrize("case", list(CSV_HOSTILE), ids=list(CSV_HOSTILE))
def test_a_hostile_csv_row_is_one_warning_naming_it_and_the_rest_is_read(tmp_path, clean_run, case):
    clean, _, _, read_clean = clean_run
    run, path = with_line(clean, tmp_path, "history.csv", CSV_HOSTILE[case][0], newline="\r\n",
                          drop="history.jsonl")
    said = []
    read = as_text(cli.load_run(run, said.append))
    assert len(said) == 1, said
    assert said[0].startswith(f"hookstats report: warning: {path}:4: field '{CSV_HOSTILE[case][1]}': ")
    assert read == read_clean


def test_a_hostile_csv_row_through_the_report_command(tmp_path, capsys, clean_run):
    clean, seen, _, _ = clean_run
    run, path = with_line(clean, tmp_path, "history.csv", CSV_HOSTILE["kind-a-path"][0], newline="\r\n",
                          drop="history.jsonl")
    code, out, err = report(capsys, run, tmp_path)
    assert code == 0 and len(err) == 1, err
    assert err[0].startswith(f"hookstats report: warning: {path}:4: field 'kind': ")
    assert "5 recorded steps (0..4)" in out
    row = table_row(out, "0:output")
    assert int(row[1]) == seen[-1].size and float(row[2]) == pytest.approx(seen[-1].mean(), rel=1e-3)


def test_many_bad_lines_are_said_one_by_one_up_to_ten_then_counted(tmp_path, capsys, monkeypatch):
    draw_nothing(monkeypatch)
    run = tmp_path / "run"
    saved_run(run)
    path = run / "history.jsonl"
    path.write_text(path.read_text() + "".join(json.dumps({**GOOD, "count": -k}) + "\n" for k in range(1, 31)))
    code, out, err = report(capsys, run, tmp_path)
    assert code == 0 and len(err) == 11 and err[-1].endswith("20 more bad line(s) skipped"), err


def test_extreme_but_valid_values_leak_no_numpy_warning(tmp_path, capsys):
    run = tmp_path / "run"
    path = run / "history.jsonl"
    sink = JSONLSink(path)
    for step in range(3):
        sink.write(step, [{"target": "a:output", "module": "a", "kind": "output", "leaf": "", "count": 2 ** 62,
                           "finite": 2 ** 62, "mean": 1.7e308, "std": 1.7e308, "near_zero": 0.0,
                           "running_min": -1.7e308, "running_max": 1.7e308, "nan": 2 ** 62,
                           "log2_hist": np.full(256, 2 ** 55, dtype=np.int64)}])
    sink.close()
    code, out, err = report(capsys, run, tmp_path)  # RuntimeWarnings are errors here
    assert code == 0 and err == [], err


def test_a_200000_character_name_costs_what_a_short_one_does(tmp_path, capsys):
    """The charts grew with a target's name (the legend's tight bounding box made the PNG as wide as the name:
    141,440 px for 20,000 characters, 3.3 GB for 200,000); names are now cut in tables and charts. Bounded by
    the output: every chart as small as with short names, every printed line short."""
    from matplotlib.image import imread
    sizes = {}
    for n in (10, 900, 200_000):
        run = tmp_path / f"run{n}"
        sink = JSONLSink(run / "history.jsonl")
        for step in range(3):
            sink.write(step, [{"target": f"{'m' * n}:output", "module": "m" * n, "kind": "output", "leaf": "",
                               "count": 4, "finite": 4, "mean": float(step), "std": 1.0, "near_zero": 0.0,
                               "log2_hist": np.arange(256, dtype=np.int64)},
                              {"target": "b:output", "module": "b", "kind": "output", "leaf": "", "count": 4,
                               "finite": 4, "mean": 1.0, "std": 1.0, "near_zero": 0.0}])
        sink.close()
        code = cli.main(["report", str(run), "--out", str(tmp_path / f"charts{n}")])
        out, err = capsys.readouterr()
        assert code == 0
        assert max(map(len, out.splitlines())) < 200
        assert len(err.splitlines()) == (1 if n > 1000 else 0) and "were shortened to 1000" in err or n <= 1000
        sizes[n] = {p.name: imread(p).shape[:2] for p in (tmp_path / f"charts{n}").glob("*.png")}
    assert sizes[200_000] == sizes[900] and sizes[200_000].keys() == sizes[10].keys()
    assert all(w < 2500 for shapes in sizes.values() for _, w in shapes.values())


def test_names_are_cut_in_the_middle_for_tables_and_charts():
    from hookstats.names import short
    assert short("a" * 60) == "a" * 60
    s = short("enc." * 100 + "fc:output")
    assert len(s) == 60 and s.startswith("enc.enc.") and s.endswith("fc:output") and "\u2026" in s


# ---- incomplete steps (a flush cut by SIGKILL) ----
@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
@pytest.mark.parametrize("cut", ["after-a-record", "torn-record"])
def test_a_step_cut_short_is_said_and_left_out(tmp_path, capsys, monkeypatch, fmt, cut):
    """Cut the file inside the last step (after its first target's record(s), or inside one): the report says
    step 4 is incomplete and shows step 3 as each target's last, not a partial step 4 as whole."""
    draw_nothing(monkeypatch)  # what is read and printed; the charts of a run with a hostile line: above
    run = tmp_path / "run"
    seen = saved_run(run)
    if fmt == "csv":
        (run / "history.jsonl").unlink()
    path = run / f"history.{fmt}"
    lines = path.read_bytes().splitlines(keepends=True)
    first = next(i for i, ln in enumerate(lines) if (b'"step": 4' in ln if fmt == "jsonl" else ln.startswith(b"4,")))
    keep = first + (2 if fmt == "jsonl" else 9)  # 0:output's record of step 4 (its rows in the CSV), not 2:output's
    data = b"".join(lines[:keep])
    path.write_bytes(data if cut == "after-a-record" else data + lines[keep][:20])
    code, out, err = report(capsys, run, tmp_path)
    assert code == 0
    said = [e for e in err if "incomplete" in e]
    assert len(said) == 1 and "step(s) 4 incomplete" in said[0] and "left out" in said[0], err
    assert len(err) == (1 if cut == "after-a-record" else 2)  # and the torn line
    assert "4 recorded steps (0..3)" in out
    row = table_row(out, "0:output")
    assert float(row[2]) == pytest.approx(seen[3].mean(), rel=1e-3)


def test_a_killed_run_then_resumed_keeps_the_resumed_records(tmp_path, capsys):
    """Run 1 wrote step 2 of 3 targets partly and died; run 2 appends steps 2..3 whole: nothing is a duplicate,
    run 1's partial step 2 is left out and said, both runs are said."""
    path = tmp_path / "run" / "history.jsonl"
    rec = lambda t, m: {"target": t, "module": t[0], "kind": "output", "leaf": "", "count": 2, "finite": 2,  # noqa
                        "mean": m, "std": 1.0, "near_zero": 0.0}
    a = JSONLSink(path)
    a.write(0, [rec("a:output", 0.0), rec("b:output", 0.0)])
    a.write(1, [rec("a:output", 1.0), rec("b:output", 1.0)])
    a.close()
    lines = path.read_text().splitlines()
    lines += [json.dumps({"type": "stats", "step": 2, **rec("a:output", 99.0)})]  # no step end: killed
    path.write_text("\n".join(lines) + "\n")
    b = JSONLSink(path)
    b.write(2, [rec("a:output", 2.0), rec("b:output", 2.0)])
    b.write(3, [rec("a:output", 3.0), rec("b:output", 3.0)])
    b.close()
    code, out, err = report(capsys, tmp_path / "run", tmp_path)
    assert code == 0 and len(err) == 2, err
    assert "holds 2 runs" in err[0] and "steps 0..2" in err[0] and "steps 2..3" in err[0]
    assert "step(s) 2 incomplete" in err[1] and "1 record(s)" in err[1]
    assert "4 recorded steps (0..3)" in out and float(table_row(out, "a:output")[2]) == 3.0
    from hookstats.sinks import read_jsonl
    with pytest.warns(UserWarning):
        items = read_jsonl(path)[0]
    assert [(s, r["mean"]) for s, r in items if r["target"] == "a:output"] == [(0, 0.0), (1, 1.0), (2, 2.0),
                                                                               (3, 3.0)]


def test_report_out_empty_is_an_error(tmp_path, capsys):
    run = tmp_path / "run"
    saved_run(run, steps=2)
    assert cli.main(["report", str(run), "--out", ""]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["hookstats report: error: --out is empty: give a folder, or leave --out out to write to "
                   "RUN_DIR/<run>/charts"]


def test_report_writes_no_file_outside_its_folder_whatever_the_file_says(tmp_path, capsys):
    # the crafted kind of the issue: a folder named like the kind's first part makes the joined path resolve
    run, charts, evil = tmp_path / "run", tmp_path / "charts", tmp_path / "EVIL.png"
    saved_run(run)
    path = run / "history.jsonl"
    kind = "x/" + "../" * 2 + "EVIL"
    path.write_text(path.read_text() + json.dumps({**GOOD, "target": "t:output", "kind": kind}) + "\n")
    (charts / "layer_stats_x").mkdir(parents=True)
    code, out, err = report(capsys, run, tmp_path)
    assert code == 0 and len(err) == 1 and "field 'kind'" in err[0], err
    assert not evil.exists() and not list(tmp_path.glob("**/*EVIL*"))
    assert all(p.resolve().parent == charts.resolve() for p in charts.glob("**/*.png"))


def test_save_all_names_files_by_kind_only_when_it_is_a_kind(tmp_path):
    from hookstats.tools import plots
    items = [(s, {"target": f"t{i}", "module": "t", "kind": kind, "leaf": "", "count": 4, "finite": 4,
                  "mean": 0.5, "std": 1.0}) for s in range(2) for i, kind in enumerate(("output", "../../EVIL"))]
    paths = plots.save_all(plots.collect(items), tmp_path / "charts")
    assert all(p.parent == tmp_path / "charts" and ".." not in p.name and "EVIL" not in p.name for p in paths)
    assert (tmp_path / "charts" / "layer_stats_output.png") in paths and not list(tmp_path.glob("**/*EVIL*"))


MATH_NAMES = ["$\\frac{a}{b}^{^{^{^}}}$", "$" + "{" * 200 + "x" + "}" * 200 + "$", "$a$ and $", "50$ \\$x$"]


@pytest.mark.parametrize("name", MATH_NAMES)
def test_target_names_are_drawn_literally_not_as_mathtext(tmp_path, capsys, name):
    run = tmp_path / "run"
    sink = JSONLSink(run / "history.jsonl")
    for step in range(2):
        sink.write(step, [{"target": f"{name}:output", "module": name, "kind": "output", "leaf": "", "count": 4,
                           "finite": 4, "mean": 0.5, "std": 1.0, "log2_hist": np.full(256, 1, dtype=np.int64)}])
    sink.close()
    code, out, err = report(capsys, run, tmp_path)
    assert code == 0 and err == [], err
