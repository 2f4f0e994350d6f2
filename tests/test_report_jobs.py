"""`hookstats report --jobs N` on a folder of runs: the folders drawn in worker processes print what one process
prints, in the folders' order, and write the same chart files; a broken run's error is the same one line."""
import pytest
import torch
from torch import nn

import hookstats
from hookstats.sinks import JSONLSink
from hookstats.tools import cli

pytest.importorskip("matplotlib")
pytestmark = pytest.mark.filterwarnings("ignore::hookstats.alerts.AlertWarning")


def write_run(folder, width, steps=3):
    torch.manual_seed(width)
    model = nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 2))
    with hookstats.attach(model, sinks=[JSONLSink(folder / "history.jsonl")], log_every=1, alerts=False):
        for _ in range(steps):
            model(torch.randn(3, 4)).square().mean().backward()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for name, width in (("b_second", 5), ("a_first", 3)):  # reported in name order, not in the order written
        write_run(root / name, width)
    return root


def report(capsys, *argv):
    code = cli.main(["report", *map(str, argv), "--no-progress"])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow  # worker processes, each importing torch and matplotlib: .ci/run runs it
def test_workers_print_what_one_process_prints_in_the_folders_order(runs, tmp_path, capsys):
    got = {}
    for jobs in (1, 2):
        out_dir = tmp_path / f"jobs{jobs}"
        code, out, err = report(capsys, runs, "--out", out_dir, "--jobs", jobs)
        assert code == 0, err
        got[jobs] = (out.replace(str(out_dir), "OUT"), err, sorted(p.relative_to(out_dir).as_posix()
                                                                    for p in out_dir.glob("*/*")))
    assert got[2] == got[1]
    heads = [ln for ln in got[2][0].splitlines() if ln.startswith("== ")]
    assert [h.split(":")[0] for h in heads] == [f"== {runs / 'a_first'}", f"== {runs / 'b_second'}"]
    assert "a_first/layer_stats_output.png" in got[2][2] and "b_second/last_step_table.txt" in got[2][2]


@pytest.mark.slow  # worker processes, each importing torch and matplotlib: .ci/run runs it
def test_a_broken_run_is_one_error_line_with_workers_as_without(runs, tmp_path, capsys):
    root = tmp_path / "runs"
    for name in ("a_first", "b_second"):
        (root / name).mkdir(parents=True)
        (root / name / "history.jsonl").write_bytes((runs / name / "history.jsonl").read_bytes())
    (root / "b_second" / "history.jsonl").write_text('{"no": "record"}\n')
    errors = []
    for jobs in (1, 2):
        code, out, err = report(capsys, root, "--out", tmp_path / f"out{jobs}", "--jobs", jobs)
        assert code == 2 and f"== {root / 'a_first'}" in out
        errors.append(err.strip().splitlines()[-1])
    assert errors[0] == errors[1] and errors[1].startswith(f"hookstats report: error: {root / 'b_second'}: ")


def test_jobs_must_be_a_positive_integer(runs, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["report", str(runs), "--jobs", "0"])
    assert e.value.code == 2 and "--jobs: must be >= 1, got 0" in capsys.readouterr().err
