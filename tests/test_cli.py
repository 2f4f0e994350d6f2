"""The command line: --help everywhere, one-line errors with exit status 2, the bench dispatch, and a short
demo run whose files `report` reads back (its table checked against the CSV the demo wrote)."""
import contextlib
import csv
import io
import os
import shutil
import subprocess
import sys
import types

import pytest

from hookstats import cli
from hookstats.summary import format_number

pytestmark = pytest.mark.filterwarnings("ignore::hookstats.alerts.AlertWarning")


def run_main(capsys, *argv):
    try:
        code = cli.main(list(argv))
    except SystemExit as e:  # argparse exits on --help and on bad arguments
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv, words", [([], ["demo", "report", "bench"]),
                                         (["demo"], ["--out", "--steps", "--device", "--nan-at"]),
                                         (["report"], ["RUN_DIR", "--out"]),
                                         (["bench"], ["--workloads", "--variants", "--device", "--clock"])])
def test_help_for_every_command(capsys, argv, words):
    code, out, _ = run_main(capsys, *argv, "--help")
    assert code == 0 and all(w in out for w in words)


@pytest.mark.parametrize("argv, message", [
    (["demo", "--steps", "0"], "argument --steps: must be >= 1, got 0"),
    (["demo", "--steps", "many"], "argument --steps: not an integer: 'many'"),
    (["demo", "--device", "nonsense"], "device 'nonsense' is not usable here"),
    (["report", "/no/such/folder"], "no such folder: /no/such/folder"),
    (["demo", "--steps", "2", "--nan-at", "5"], "--nan-at 5 is not a step of this run (steps 0..1)"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    ([], "the following arguments are required"),
])
def test_bad_arguments_give_one_line_and_status_2(capsys, argv, message):
    code, out, err = run_main(capsys, *argv)
    assert code == 2 and message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("threads", ["-1", "0", "two"])
def test_bench_rejects_a_bad_thread_count_before_running(capsys, threads):
    code, _, err = run_main(capsys, "bench", "--threads", threads)
    assert code == 2 and f"argument --threads: expected an integer >= 1, got '{threads}'" in err
    assert "Traceback" not in err


def test_demo_out_below_a_file_is_a_one_line_error(capsys, tmp_path):
    (tmp_path / "file").write_text("x")
    code, _, err = run_main(capsys, "demo", "--out", str(tmp_path / "file" / "sub"), "--steps", "1", "--device", "cpu")
    assert code == 2 and "cannot make the folder" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_report_on_a_folder_without_history(capsys, tmp_path):
    code, _, err = run_main(capsys, "report", str(tmp_path))
    assert code == 2 and "holds no history.jsonl or history.csv" in err


def test_bench_dispatches_to_hookstats_bench_main(capsys, monkeypatch):
    seen = []
    monkeypatch.setitem(sys.modules, "hookstats.bench", types.SimpleNamespace(main=lambda argv: seen.append(argv) or 0))
    assert cli.main(["bench", "--quick", "--device", "cpu"]) == 0
    assert seen == [["--quick", "--device", "cpu"]]
    monkeypatch.setitem(sys.modules, "hookstats.bench", types.SimpleNamespace())
    code, _, err = run_main(capsys, "bench")
    assert code == 2 and err.strip() == "hookstats bench: error: hookstats.bench has no main(argv)"
    monkeypatch.setitem(sys.modules, "hookstats.bench", None)  # import fails
    code, _, err = run_main(capsys, "bench")
    assert code == 2 and err.startswith("hookstats bench: error: the benchmark module is not available")


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = cli.main(["demo", "--out", str(out), "--steps", "6", "--models", "cnn", "--nan-at", "4",
                         "--no-progress", "--device", "cpu"])
    assert code == 0
    (out / "stdout.txt").write_text(printed.getvalue())
    return out


def test_demo_prints_the_layer_table_and_the_alerts(demo_dir):
    printed = (demo_dir / "stdout.txt").read_text()
    lines = printed.splitlines()
    header = next(ln for ln in lines if ln.startswith("layer "))
    assert all(w in header for w in ("type", "output shape", "params", "mean", "std", "near zero %", "nan/inf"))
    with open(demo_dir / "cnn" / "history.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["target"] == "body.0:output" and r["stat"] == "count"]
    assert any(ln.split()[:2] == ["body.0", "Conv2d"] for ln in lines)
    assert "NaN/Inf in head:output at step 4" in printed and rows


def test_demo_writes_every_output(demo_dir):
    run = demo_dir / "cnn"
    for name in ("history.csv", "history.jsonl", "summary.txt", "alerts.txt"):
        assert (run / name).stat().st_size > 0, name
    assert any(p.name.startswith("events.out.tfevents") for p in (run / "tensorboard").iterdir())
    charts = {p.name for p in (run / "charts").glob("*.png")}
    assert {"layer_stats_output.png", "hist_linear_output.png", "hist_log2_grad_output.png",
            "dynamic_range.png"} <= charts
    with open(run / "history.csv") as f:
        rows = list(csv.DictReader(f))
    assert {int(r["step"]) for r in rows} == set(range(6))
    assert {r["kind"] for r in rows} >= {"output", "grad_output", "input", "grad_input", "param_grad"}
    alerts = (run / "alerts.txt").read_text()
    assert "NaN/Inf in head:output at step 4 (the first target in forward order" in alerts
    summary = (run / "summary.txt").read_text()
    assert "SmallCNN:" in summary and "body.0" in summary


def test_report_rebuilds_charts_and_prints_the_last_step(demo_dir, tmp_path, capsys):
    code, out, err = run_main(capsys, "report", str(demo_dir), "--out", str(tmp_path))
    assert code == 0, err
    assert {p.name for p in (tmp_path / "cnn").glob("*.png")} == {p.name for p in (demo_dir / "cnn" / "charts").glob("*.png")}
    with open(demo_dir / "cnn" / "history.csv") as f:
        want = {r["stat"]: float(r["value"]) for r in csv.DictReader(f)
                if r["step"] == "5" and r["target"] == "body.0:grad_output"}
    line = next(ln for ln in out.splitlines() if ln.startswith("body.0:grad_output "))
    count, mean = line.split()[1:3]
    assert int(count.replace(",", "")) == int(want["count"])
    assert mean == format_number(want["mean"])
    assert "alerts (" in out and "NaN/Inf in head:output at step 4" in out


def test_report_from_csv_only_and_from_a_broken_jsonl(demo_dir, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(demo_dir / "cnn", run, ignore=shutil.ignore_patterns("charts", "tensorboard"))
    os.remove(run / "history.jsonl")
    code, out, err = run_main(capsys, "report", str(run))
    assert code == 0, err
    assert {p.name for p in (run / "charts").glob("*.png")} >= {"layer_stats_output.png"}
    assert not (run / "charts" / "dynamic_range.png").exists()  # the CSV has no histograms
    (run / "history.jsonl").write_text("{not json\n")
    code, _, err = run_main(capsys, "report", str(run))
    assert code == 2 and "history.jsonl:1: not JSON" in err and len(err.strip().splitlines()) == 1
    good = (demo_dir / "cnn" / "history.jsonl").read_text().splitlines()[0]
    for broken in (good.replace('"step": 0', '"step": "zero"'), good.replace('"log2_hist": {"', '"log2_hist": {"9999": 1, "'),
                   good.replace('"hist_range"', '"no_range"')):
        assert broken != good
        (run / "history.jsonl").write_text(good + "\n" + broken + "\n")
        code, _, err = run_main(capsys, "report", str(run))
        assert code == 2 and "history.jsonl:2: malformed hookstats record" in err, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_python_dash_m_entry_point():
    r = subprocess.run([sys.executable, "-m", "hookstats", "report", "/no/such/folder"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip() == "hookstats report: error: no such folder: /no/such/folder"
