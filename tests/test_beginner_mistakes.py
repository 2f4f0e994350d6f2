"""A beginner's mistake gets one line that says what to do: attaching twice, a model without parameters, a
misspelled keyword, an optimizer for a model, stats() before any step, `report` on a history file; and what a
first run shows is ours alone: one run id in the CSV and JSONL files of one monitor, no notices of transformers
in `hookstats plan gpt2`."""
import csv
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import hookstats
from hookstats.monitor import AttachedTwiceWarning
from hookstats.sinks import CSVSink, JSONLSink

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def test_attaching_twice_to_one_model_warns_naming_the_fix():
    model = net()
    first = hookstats.attach(model)
    with pytest.warns(AttachedTwiceWarning, match=r"already has a monitor attached.*remove\(\) on the first"):
        second = hookstats.attach(model)
    second.remove()
    first.remove()
    with warnings.catch_warnings():
        warnings.simplefilter("error", AttachedTwiceWarning)
        hookstats.attach(model).remove()  # the first removed: no warning


def test_a_model_without_parameters_names_include_paramless():
    with pytest.raises(ValueError, match=r"include_paramless=True"):
        hookstats.attach(nn.Sequential(nn.ReLU(), nn.Tanh()))
    with pytest.raises(ValueError, match=r"check modules=, types= and exclude="):  # a selection that matches none
        hookstats.attach(net(), types=[nn.Conv2d])


def test_a_misspelled_keyword_is_a_type_error_with_the_close_match():
    with pytest.raises(TypeError, match=r"^attach\(\) got an unexpected keyword argument 'histroy' "
                                        r"\(did you mean history\?\)$"):
        hookstats.attach(net(), histroy=True)
    with pytest.raises(TypeError, match=r"'hist_evry' \(did you mean hist_every\?\)"):
        hookstats.attach(net(), hist_evry=2)
    with pytest.raises(TypeError, match=r"'zzzz'$"):
        hookstats.attach(net(), zzzz=1)


def test_an_optimizer_for_a_model_names_its_type_only():
    opt = torch.optim.SGD(net().parameters(), lr=0.1)
    with pytest.raises(ValueError) as e:
        hookstats.attach(opt)
    assert str(e.value) == "attach: model must be an nn.Module (or a paddle.nn.Layer), got torch.optim.sgd.SGD"


def test_stats_before_any_step_says_no_step_was_measured():
    model = net()
    with hookstats.attach(model) as mon:
        with pytest.warns(RuntimeWarning, match="no step was measured yet") as said:
            assert mon.stats() == {}
        assert said[0].filename == __file__
        model(torch.randn(3, 4))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert mon.stats()["0:output"]["count"] == 24


def train_with_files(folder, steps=6):
    model = net()
    with hookstats.attach(model, sinks=[CSVSink(folder / "history.csv"), JSONLSink(folder / "history.jsonl")],
                          log_every=3, alerts=False):
        for _ in range(steps):
            model(torch.randn(16, 4)).square().mean().backward()


def test_the_csv_and_jsonl_files_of_one_monitor_name_one_run(tmp_path):
    train_with_files(tmp_path)
    with open(tmp_path / "history.jsonl") as f:
        jsonl = [json.loads(line)["run"] for line in f if '"type": "run"' in line]
    with open(tmp_path / "history.csv") as f:
        rows = list(csv.DictReader(f))
    runs = [r["leaf"] for r in rows if r["kind"] == "#run"]
    assert len(jsonl) == 1 and runs == jsonl
    train_with_files(tmp_path)  # a second monitor: a second run, one id again
    with open(tmp_path / "history.jsonl") as f:
        jsonl = [json.loads(line)["run"] for line in f if '"type": "run"' in line]
    with open(tmp_path / "history.csv") as f:
        runs = [r["leaf"] for r in csv.DictReader(f) if r["kind"] == "#run"]
    assert len(set(jsonl)) == 2 and runs == jsonl


@pytest.mark.parametrize("name", ["history.jsonl", "history.csv"])
def test_report_takes_a_history_file(tmp_path, name, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    from hookstats.tools import lowprec_plots, plots
    from hookstats.tools.cli import main
    for module, chart in ((plots, "plot_layer_stats"), (plots, "plot_hist_heatmap"), (plots, "plot_dynamic_range"),
                          (lowprec_plots, "plot_lowprec_grid")):  # the file read, not the drawing (test_plots')
        monkeypatch.setattr(module, chart, lambda *a, **k: Path(k.get("path", a[-1])).write_bytes(b"png"))
    train_with_files(tmp_path)
    assert main(["report", str(tmp_path / name), "--no-progress"]) == 0
    assert "6 recorded steps" in capsys.readouterr().out
    assert list((tmp_path / "charts").glob("*.png"))


def test_report_on_a_missing_path_says_folder_or_file(tmp_path, capsys):
    from hookstats.tools.cli import main
    assert main(["report", str(tmp_path / "nothing.jsonl")]) == 2
    assert "no such folder or history file" in capsys.readouterr().err


@pytest.mark.slow  # a new process importing transformers and building gpt2: the longest test of the fast suite
def test_plan_prints_no_notices_of_transformers():
    pytest.importorskip("transformers")
    out = subprocess.run([sys.executable, "-m", "hookstats", "plan", "gpt2", "--totals"], capture_output=True,
                         text=True, cwd=ROOT, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr
    assert out.stderr == "" and "transformers" not in out.stdout


def test_report_of_a_loss_sum_run_draws_charts_of_a_page_s_size(tmp_path):
    """loss = out.sum() (as tutorials write it): the last layer's output gradient is all ones, std 0 on the std
    panel's log axis beside positive ones; the chart stays a page, not millions of pixels tall."""
    pytest.importorskip("matplotlib")
    from matplotlib import image
    from hookstats.tools.cli import main
    model = net()
    with hookstats.attach(model, sinks=[JSONLSink(tmp_path / "history.jsonl")], log_every=3, alerts=False):
        for _ in range(6):
            model(torch.randn(3, 4)).sum().backward()
    assert main(["report", str(tmp_path), "--no-progress"]) == 0
    for png in (tmp_path / "charts").glob("*.png"):
        assert image.imread(png).shape[0] < 5000, png.name
