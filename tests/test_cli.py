"""The command line: --help everywhere, one-line errors with exit status 2, the bench dispatch, and a short
demo run whose files `report` reads back (its table checked against the CSV the demo wrote)."""
import contextlib
import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import types

import pytest
from conftest import made_once
from helpers import draw_nothing

from hookstats.tools import cli
from hookstats.tools.lowprec_plots import GRID_FILE
from hookstats.tools.summary import format_number

pytestmark = pytest.mark.filterwarnings("ignore::hookstats.alerts.AlertWarning")


def run_main(capsys, *argv):
    try:
        code = cli.main(list(argv))
    except SystemExit as e:  # argparse exits on --help and on bad arguments
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv, words", [([], ["demo", "report", "bench"]),
                                         (["demo"], ["--out", "--steps", "--device", "--nan-at", "--no-progress"]),
                                         (["report"], ["RUN_DIR", "--out", "--no-progress"]),
                                         (["bench"], ["--workloads", "--variants", "--device", "--clock",
                                                      "--no-progress"])])
def test_help_for_every_command(capsys, argv, words):
    code, out, _ = run_main(capsys, *argv, "--help")
    assert code == 0 and all(w in out for w in words)


def test_bench_help_lists_the_variants_by_their_plain_names_and_the_defaults(capsys):
    from hookstats.tools.bench import VARIANT_LIST
    code, out, _ = run_main(capsys, "bench", "--help")
    assert code == 0
    names = [v.name for v in VARIANT_LIST]
    assert len(names) == 13 and all(re.fullmatch(r"[a-z0-9-]+", n) for n in names)  # typed without quotes
    listed = {ln.split()[0]: ln.split(None, 1)[1] for ln in out.splitlines() if ln.startswith("  ") and
              ln.split()[0] in names}
    assert [n for n in listed] == names and all(v.label in listed[v.name] for v in VARIANT_LIST)
    flat = " ".join(out.split())
    for option, default in (("--workloads", "cnn,transformer"), ("--repeats", "3"), ("--steps", "10"),
                            ("--memory-steps", "20"), ("--clock", "wall"), ("--device", "cpu")):
        assert re.search(re.escape(option) + r" .*?\(.*?default: " + re.escape(default) + r"\)", flat), option


@pytest.mark.parametrize("argv, message", [
    (["demo", "--steps", "0"], "argument --steps: must be >= 1, got 0"),
    (["demo", "--steps", "many"], "argument --steps: not an integer: 'many'"),
    (["demo", "--device", "nonsense"], "device 'nonsense' is not usable here"),
    (["report", "/no/such/folder"], "no such folder or history file: /no/such/folder"),
    (["demo", "--steps", "2", "--nan-at", "5"], "--nan-at 5 is not a step of this run (steps 0..1)"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    ([], "the following arguments are required"),
    (["demo", "--nan-at", "-1"], "argument --nan-at: must be >= 0, got -1"),
    (["demo", "--seed", "-3"], "argument --seed: must be >= 0, got -3"),
    (["demo", "--seed", str(2**64)], f"argument --seed: must be <= {2**64 - 1}, got {2**64}"),
    (["demo", "--models", "mlp"], "argument --models: invalid choice: 'mlp'"),
    (["demo", "--device", "meta"], "device 'meta' holds no values to train on"),
    (["bench", "--steps", "0"], "argument --steps: must be >= 1, got 0"),
    (["bench", "--steps", "-1"], "argument --steps: must be >= 1, got -1"),
    (["bench", "--repeats", "0"], "argument --repeats: must be >= 1, got 0"),
    (["bench", "--repeats", "x"], "argument --repeats: not an integer: 'x'"),
    (["bench", "--memory-steps", "-1"], "argument --memory-steps: must be >= 0, got -1"),
    (["bench", "--threads", "0"], "argument --threads: must be >= 1, got 0"),
    (["bench", "--threads", "two"], "argument --threads: not an integer: 'two'"),
    (["bench", "--workloads", "bogus"], "argument --workloads: unknown workload 'bogus': cnn, transformer or stackN"),
    (["bench", "--workloads", "cnn,stack0"], "argument --workloads: unknown workload 'stack0'"),
    (["bench", "--workloads", "cnn,"], "argument --workloads: an empty name in 'cnn,'"),
    (["bench", "--variants", "hookstats,bogus"], "argument --variants: unknown variant 'bogus'"),
    (["bench", "--variants", "no hooks"], "argument --variants: unknown variant 'no hooks'"),
    (["bench", "--clock", "sundial"], "argument --clock: invalid choice: 'sundial'"),
    (["bench", "--clock", "cpu", "--threads", "2"], "--clock cpu: the cpu clock counts only the calling thread"),
    (["bench", "--device", "meta"], "--device meta: the benchmarks run on cpu or cuda, not meta"),
    (["bench", "--device", "gpu"], "--device gpu:"),
    (["bench", "--json", "/no/such/folder/r.json"], "argument --json: cannot write /no/such/folder/r.json"),
    (["bench", "--frobnicate"], "unrecognized arguments: --frobnicate"),
])
def test_bad_arguments_give_one_line_and_status_2(capsys, monkeypatch, argv, message):
    import hookstats.tools.bench.command
    import hookstats.tools.demo

    def ran(*a, **k):
        raise AssertionError("bad arguments went through to a run")
    monkeypatch.setattr(hookstats.tools.bench.command, "run", ran)
    monkeypatch.setattr(hookstats.tools.demo, "run", ran)
    code, out, err = run_main(capsys, *argv)
    assert code == 2 and message in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


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
    monkeypatch.setitem(sys.modules, "hookstats.tools.bench", types.SimpleNamespace(main=lambda argv: seen.append(argv) or 0))
    assert cli.main(["bench", "--quick", "--device", "cpu"]) == 0
    assert seen == [["--quick", "--device", "cpu"]]
    monkeypatch.setitem(sys.modules, "hookstats.tools.bench", types.SimpleNamespace())
    code, _, err = run_main(capsys, "bench")
    assert code == 2 and err.strip() == "hookstats bench: error: hookstats.tools.bench has no main(argv)"
    monkeypatch.setitem(sys.modules, "hookstats.tools.bench", None)  # import fails
    code, _, err = run_main(capsys, "bench")
    assert code == 2 and err.startswith("hookstats bench: error: the benchmark module is not available")


class Terminal(io.StringIO):
    """A stderr that says it is a terminal, as a user's shell is (where progress bars are drawn)."""

    def isatty(self):
        return True


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    return made_once(tmp_path_factory, "cli_demo", run_demo)  # once for all xdist workers; tests only read it


def run_demo(out):
    printed, bars = io.StringIO(), Terminal()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(bars):
        code = cli.main(["demo", "--out", str(out), "--steps", "6", "--models", "cnn", "--nan-at", "4",
                         "--device", "cpu"])
    assert code == 0
    (out / "stdout.txt").write_text(printed.getvalue())
    (out / "stderr.txt").write_text(bars.getvalue())


def test_demo_shows_progress_of_training_and_charts_on_a_terminal(demo_dir):
    bars = (demo_dir / "stderr.txt").read_text()
    charts = len(list((demo_dir / "cnn" / "charts").glob("*.png")))  # the bar counts every chart the demo draws
    assert re.search(r"cnn on cpu: 100%.*6/6", bars) and re.search(rf"cnn charts: 100%.*\b{charts}/{charts} ", bars)
    assert "cnn on cpu" not in (demo_dir / "stdout.txt").read_text()


@pytest.mark.parametrize("terminal, flag, drawn", [(True, [], True), (True, ["--no-progress"], False),
                                                   (False, [], False)])
def test_report_progress_only_on_a_terminal_and_without_no_progress(demo_dir, tmp_path, monkeypatch, terminal, flag,
                                                                    drawn):
    draw_nothing(monkeypatch)  # the bar, not the drawing
    err, out = Terminal() if terminal else io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert cli.main(["report", str(demo_dir / "cnn"), "--out", str(tmp_path), *flag]) == 0
    # the bar counts every chart drawn: the steps', the what-if figure and the gradient norms
    charts = len(list(tmp_path.glob("*.png")))
    assert {GRID_FILE, "grad_norms.png"} <= {p.name for p in tmp_path.glob("*.png")}
    assert (f"charts of cnn: 100%" in err.getvalue() and f"{charts}/{charts}" in err.getvalue()) == drawn
    assert err.getvalue() == "" or drawn
    assert "charts of cnn" not in out.getvalue()


def test_bench_runs_the_chosen_variants_with_a_progress_bar(capsys, tmp_path):
    err, out = Terminal(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["bench", "--workloads", "stack2", "--variants", "hookstats", "--repeats", "2", "--steps", "1",
                         "--memory-steps", "0", "--json", str(tmp_path / "r.json")])
    assert code == 0
    rows = [ln.split("  ")[0] for ln in out.getvalue().splitlines()[3:5]]
    assert rows == ["no hooks", "hookstats"]  # the baseline always, the labels in the table
    assert "6/6" in err.getvalue()  # 2 variants x (2 timed rounds + the sync count), no memory runs
    assert list(json.loads((tmp_path / "r.json").read_text())["workloads"]["stack2"]) == rows


def test_no_empty_alerts_file_and_no_stale_one(tmp_path, capsys, monkeypatch):
    from hookstats.tools import plots
    monkeypatch.setattr(plots, "save_all", lambda *a, **k: [])  # the files, not the charts
    (tmp_path / "cnn").mkdir()
    (tmp_path / "cnn" / "alerts.txt").write_text("NaN/Inf in an earlier run\n")
    code, out, err = run_main(capsys, "demo", "--out", str(tmp_path), "--steps", "2", "--models", "cnn",
                              "--device", "cpu", "--no-tensorboard")
    assert code == 0, err
    assert not (tmp_path / "cnn" / "alerts.txt").exists() and "alerts: none" in out
    wrote = next(ln for ln in out.splitlines() if ln.startswith("wrote "))
    assert "alerts.txt" not in wrote and "tensorboard" not in wrote and "summary.txt" in wrote


def test_demo_prints_the_layer_table_and_the_alerts(demo_dir):
    printed = (demo_dir / "stdout.txt").read_text()
    lines = printed.splitlines()
    header = next(ln for ln in lines if ln.startswith("layer "))
    assert all(w in header for w in ("type", "output shape", "params", "mean", "std", "near zero %", "nan/inf"))
    with open(demo_dir / "cnn" / "history.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["target"] == "body.0:output" and r["stat"] == "count"]
    assert any(ln.split()[:2] == ["body.0", "Conv2d"] for ln in lines)
    assert "NaN/Inf in head:output at step 4" in printed and rows
    wrote = next(ln for ln in lines if ln.startswith("wrote "))
    assert "alerts.txt" in wrote and "tensorboard/" in wrote


def test_demo_prints_the_gradient_norm_and_what_clipping_would_do(demo_dir):
    """The global norm of each step from the CSV's parameter-gradient l2 rows (the root of their sum of squares,
    as clip_grad_norm_ computes it): its median (NaN steps, after the NaN at step 4, left out) and the steps over
    max_norm=1 are the demo's line."""
    import numpy as np
    squares = {}
    with open(demo_dir / "cnn" / "history.csv") as f:
        for r in csv.DictReader(f):
            if r["kind"] == "param_grad" and r["stat"] == "l2":
                squares[int(r["step"])] = squares.get(int(r["step"]), 0.0) + float(r["value"]) ** 2
    total = np.sqrt([squares[s] for s in sorted(squares)])
    assert len(total) == 6 and np.isnan(total[4:]).all() and np.isfinite(total[:4]).all()
    line = next(ln for ln in (demo_dir / "stdout.txt").read_text().splitlines() if ln.startswith("gradient norm: "))
    assert line == (f"gradient norm: median {np.nanmedian(total):.3g} over 6 recorded steps; "
                    f"clip_grad_norm_(max_norm=1) would clip {int((total > 1).sum())} of them (grad_norms.png)")


def test_demo_writes_every_output(demo_dir):
    run = demo_dir / "cnn"
    for name in ("history.csv", "history.jsonl", "summary.txt", "alerts.txt"):
        assert (run / name).stat().st_size > 0, name
    assert any(p.name.startswith("events.out.tfevents") for p in (run / "tensorboard").iterdir())
    charts = {p.name for p in (run / "charts").glob("*.png")}
    assert {"layer_stats_output.png", "hist_linear_output.png", "hist_log2_grad_output.png",
            "dynamic_range.png", "grad_norms.png", GRID_FILE} <= charts
    with open(run / "history.csv") as f:
        rows = list(csv.DictReader(f))
    assert {int(r["step"]) for r in rows} == set(range(6))
    assert {r["kind"] for r in rows} >= {"output", "grad_output", "input", "grad_input", "param_grad"}
    alerts = (run / "alerts.txt").read_text()
    assert "NaN/Inf in head:output at step 4 (the first target in forward order" in alerts
    summary = (run / "summary.txt").read_text()
    assert "SmallCNN:" in summary and "body.0" in summary


def test_report_rebuilds_charts_and_prints_the_last_step(demo_dir, tmp_path, capsys, monkeypatch):
    draw_nothing(monkeypatch)
    code, out, err = run_main(capsys, "report", str(demo_dir), "--out", str(tmp_path))
    assert code == 0, err
    rebuilt = {p.name for p in (tmp_path / "cnn").glob("*.png")}
    drawn = {p.name for p in (demo_dir / "cnn" / "charts").glob("*.png")}
    assert drawn == rebuilt  # the demo draws the gradient norms and the what-if figure too
    with open(demo_dir / "cnn" / "history.csv") as f:
        want = {r["stat"]: float(r["value"]) for r in csv.DictReader(f)
                if r["step"] == "5" and r["target"] == "body.0:grad_output"}
    line = next(ln for ln in out.splitlines() if ln.startswith("body.0:grad_output "))
    count, mean = line.split()[1:3]
    assert int(count.replace(",", "")) == int(want["count"])
    assert mean == format_number(want["mean"])
    assert "alerts (" in out and "NaN/Inf in head:output at step 4" in out


def test_report_from_csv_only_and_from_a_broken_jsonl(demo_dir, tmp_path, capsys, monkeypatch):
    draw_nothing(monkeypatch)
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
    # a record of a flush's last step: the one with the float buckets (a slot past their 4096: malformed)
    good = next(ln for ln in (demo_dir / "cnn" / "history.jsonl").read_text().splitlines() if '"float_hist": {"' in ln)
    # a bad line among good ones: one warning naming file, line and field, the line skipped, the rest read
    for broken, field in ((re.sub(r'"step": \d+', '"step": "zero"', good, count=1), "step"),
                          (good.replace('"float_hist": {"', '"float_hist": {"99999": 1, "'), "float_hist"),
                          (good.replace('"float_hist": {"', '"float_hist": {"5": "x", "'), "float_hist[5]")):
        assert broken != good  # the demo has no linear bins
        (run / "history.jsonl").write_text(good + "\n" + broken + "\n")
        code, _, err = run_main(capsys, "report", str(run))
        assert code == 0 and f"history.jsonl:2: field '{field}': " in err and "line skipped" in err, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_python_dash_m_entry_point():
    r = subprocess.run([sys.executable, "-m", "hookstats", "report", "/no/such/folder"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip() == "hookstats report: error: no such folder or history file: /no/such/folder"


def saved_run(run, config):
    """A run folder as attach(sinks=run_dir_sinks(...)) saves it (4 steps, a flush every 2), and the count and
    mean of 0:output's last step, from a hook of the test's own."""
    import torch
    from torch import nn

    import hookstats
    from hookstats.sinks import run_dir_sinks
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 30), nn.ReLU(), nn.Linear(30, 3))
    seen = []
    model[0].register_forward_hook(lambda m, i, o: seen.append(o.detach().double()))
    # hist_every=1: every step's line carries its linear bins (steps without histograms carry none: the cadence)
    mon = hookstats.attach(model, sinks=run_dir_sinks(run, tensorboard=False), log_every=2, alerts=False, hist_every=1,
                           **config)
    for s in range(4):
        model(torch.randn(8, 5) * (1 + s)).square().mean().backward()
    mon.remove()
    return seen[-1].numel(), seen[-1].mean().item()


@pytest.mark.parametrize("config, linear", [({}, False), ({"nbins": 8, "lo": -2.0, "hi": 2.0}, True),
                                            ({"linear_hist": True, "float_hist": False}, True)],
                         ids=["defaults", "linear+buckets", "linear-only"])
def test_report_on_a_run_saved_with_and_without_linear_bins(tmp_path, capsys, monkeypatch, config, linear):
    """Defaults (float buckets, no linear bins): no line has `hist` or `hist_range`, so a missing range cannot be
    missed, and the value heatmap is the buckets' view; with linear bins every line has both, and a line whose
    range is cut is one error naming it."""
    run = tmp_path / "run"
    count, mean = saved_run(run, config)
    lines = (run / "history.jsonl").read_text().splitlines()
    records = [r for r in map(json.loads, lines) if r["type"] == "stats"]
    assert all(("hist" in r) == ("hist_range" in r) == linear for r in records)
    assert any("float_hist" in r for r in records) == config.get("float_hist", True)
    code, out, err = run_main(capsys, "report", str(run), "--out", str(tmp_path / "charts"))
    assert code == 0, err
    assert {"layer_stats_output.png", "hist_linear_output.png", "hist_log2_output.png", "dynamic_range.png"} <= \
        {p.name for p in (tmp_path / "charts").glob("*.png")}
    row = next(ln for ln in out.splitlines() if ln.startswith("0:output ")).split()
    assert int(row[1].replace(",", "")) == count and float(row[2]) == pytest.approx(mean, rel=1e-3, abs=1e-6)
    assert ("near 0 rel %" in out) == config.get("float_hist", True)

    draw_nothing(monkeypatch)  # drawn above; below, the lines read
    good = next(ln for ln in lines if '"target": "0:output"' in ln)
    if linear:
        broken = [(re.sub(r', "hist_range": \[[^\]]*\]', "", good), "hist_range"),
                  (good.replace('"hist": [', '"hist": ["x", '), "hist")]
    else:  # linear bins in one line only: without their range, that line is malformed too
        broken = [(good.replace('"step": ', '"hist": [1, 2], "step": ', 1), "hist_range")]
    for bad, field in broken:
        assert bad != good
        (run / "history.jsonl").write_text(good + "\n" + bad + "\n")
        code, _, err = run_main(capsys, "report", str(run), "--out", str(tmp_path / "charts"))
        assert code == 0 and f"history.jsonl:2: field '{field}': " in err and "line skipped" in err, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_report_takes_the_quantiles_from_the_last_window_with_buckets(tmp_path, capsys, monkeypatch):
    """log_every=2 under hist_every=10: most flush windows hold no histogram step, the run's last one
    among them. The report's |x| quantiles come from the last window that has buckets (step 20's values here),
    within the buckets' 1/17 relative error of NumPy's, not NaN."""
    import numpy as np
    import torch
    from torch import nn

    import hookstats
    from hookstats.sinks import run_dir_sinks
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 30), nn.ReLU(), nn.Linear(30, 3))
    seen = []
    model[0].register_forward_hook(lambda m, i, o: seen.append(o.detach().double().abs().reshape(-1).numpy()))
    mon = hookstats.attach(model, sinks=run_dir_sinks(tmp_path / "run", tensorboard=False), log_every=2, alerts=False,
                           hist_every=10)
    for s in range(25):
        model(torch.randn(8, 5) * (1 + s)).square().mean().backward()
    mon.remove()
    assert mon.cfg.hist_every == 10
    draw_nothing(monkeypatch)  # the table, not the charts
    code, out, err = run_main(capsys, "report", str(tmp_path / "run"), "--out", str(tmp_path / "charts"))
    assert code == 0, err
    header = next(ln for ln in out.splitlines() if ln.startswith("target "))
    for words in ("near zero %", "near 0 rel %", "p1 |x|", "p50 |x|", "p99 |x|"):
        header = header.replace(words, words.replace(" ", "_"))
    header = header.split()
    row = dict(zip(header, next(ln for ln in out.splitlines() if ln.startswith("0:output ")).split()))
    for col, q in (("p1_|x|", 0.01), ("p50_|x|", 0.5), ("p99_|x|", 0.99)):
        want = np.quantile(seen[20], q, method="inverted_cdf")
        assert float(row[col]) == pytest.approx(want, rel=1 / 17 + 1e-3), col
