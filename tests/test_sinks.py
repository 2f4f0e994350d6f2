"""Sinks: what each writes is read back with an independent reader (csv, json, TensorBoard's own
EventAccumulator, W&B's offline run file) and compared with a float64 NumPy oracle of each step's tensors."""
import glob
import json
import math
import warnings

import numpy as np
import pytest
import torch
from helpers import oracle
from wandb_file import offline_history
from torch import nn

import hookstats
from hookstats.alerts import AlertWarning
from hookstats.sinks import (CSVSink, JSONLSink, MemorySink, SkippedLinesWarning, TensorBoardSink, read_csv,
                             read_jsonl, run_dir_sinks)
from hookstats.records import finalize

pytestmark = pytest.mark.filterwarnings("error::hookstats.history.HistoryWarning")


def train(sinks, steps=5, nan_at=None, log_every=2):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
    # the kernel's per-step histograms (linear, log2 slots); the sinks with float buckets: tests/test_float_sinks.py
    mon = hookstats.attach(model, steps="manual", sinks=sinks, log_every=log_every, nbins=10, lo=-3, hi=3,
                           float_hist=False, hist_every=1)
    outs = []
    for s in range(steps):
        x = torch.randn(6, 5) * (1 + s)
        if s == nan_at:
            x[0, 0] = float("nan")
        with torch.no_grad():
            model(x)
            outs.append(nn.functional.linear(x, model[0].weight, model[0].bias))
        mon.step()
    mon.remove()
    return mon, [finalize(*oracle(o, mon.cfg), mon.cfg) for o in outs]


def test_several_sinks_at_once_and_a_user_sink():
    class Mine:
        def __init__(self):
            self.got, self.closed = [], False

        def write(self, step, records):
            self.got.append((step, [r["target"] for r in records]))

        def close(self):
            self.closed = True

    mine, mem = Mine(), MemorySink()
    train([mine, mem], steps=3)
    assert [s for s, _ in mine.got] == [0, 1, 2] and mine.closed
    assert mine.got[0][1] == ["0:output", "2:output"]
    assert [s for s, _ in mem.steps] == [0, 1, 2]


def test_a_sink_of_ones_own_is_a_small_subclass():
    """A user's sink as one would write it: a Sink subclass with write(step, records), here appending to a list
    with the base's selection (stats, prefix) and dashboard names. Through attach(sinks=[...]) it gets every train
    step and every validation pass (phase "eval"), each value the test's own hooks' float64 NumPy mean and count,
    and the alerts."""
    class ToList(hookstats.sinks.Sink):
        def __init__(self):
            super().__init__(stats=("count", "mean"), prefix="mine/")
            self.rows, self.alerts = [], []

        def write(self, step, records):
            self.rows += [(step, name, v) for rec in records for name, v in self.named_values(rec)]

        def write_alerts(self, step, alerts):
            self.alerts += [a["kind"] for a in alerts]

    torch.manual_seed(0)
    model, sink, want = nn.Sequential(nn.Linear(4, 3)), ToList(), []
    model[0].register_forward_hook(
        lambda m, i, o: want.extend((step, f"mine/0/output{'' if m.training else '/eval'}/{stat}", v) for stat, v in
                                    (("count", o.numel()), ("mean", o.detach().double()[o.isfinite()].mean().item()))))
    mon = hookstats.attach(model, eval=True, grads=False, steps="manual", log_every=2, sinks=[sink])
    for step in range(3):
        x = torch.randn(5, 4)
        if step == 2:
            x[0, 0] = float("nan")
        model(x)
        model.eval()
        with torch.no_grad():
            model(torch.randn(2, 4))
        model.train()
        mon.step()
    with pytest.warns(AlertWarning, match="NaN/Inf in 0:output at step 2"):
        mon.remove()
    assert sorted(r[:2] for r in sink.rows) == sorted(r[:2] for r in want)
    got = dict(((s, n), v) for s, n, v in sink.rows)
    for s, n, v in want:
        assert got[(s, n)] == (v if n.endswith("count") else pytest.approx(v, rel=1e-6)), (s, n)
    assert sink.alerts == ["nonfinite"]


def test_csv_long_table_round_trip(tmp_path):
    path = tmp_path / "h.csv"
    mon, want = train([CSVSink(path)], nan_at=3)
    with open(path) as f:
        header = f.readline().strip()
    assert header == "step,target,module,kind,leaf,phase,stat,value"
    items, alerts = read_csv(path)
    got = {(s, r["target"]): r for s, r in items}
    for s, w in enumerate(want):
        r = got[(s, "0:output")]
        assert r["count"] == w["count"] and r["nan"] == w["nan"]
        np.testing.assert_allclose([r["mean"], r["std"]], [w["mean"], w["std"]], rtol=1e-6)
    assert [(a["step"], a["target"], a["kind"]) for a in alerts][:1] == [(3, "0:output", "nonfinite")]


def test_jsonl_keeps_histograms_and_writes_nan_as_null(tmp_path):
    path = tmp_path / "h.jsonl"
    mon, want = train([JSONLSink(path)], steps=4)
    lines = [json.loads(line) for line in open(path)]
    assert {line["type"] for line in lines} == {"run", "stats", "step_end"}  # a run header, step-end markers
    items, alerts = read_jsonl(path)
    got = {(s, r["target"]): r for s, r in items}
    for s, w in enumerate(want):
        r = got[(s, "0:output")]
        np.testing.assert_array_equal(r["hist"], w["hist"])
        np.testing.assert_array_equal(r["log2_hist"], w["log2_hist"])
        np.testing.assert_allclose(r["hist_edges"], w["hist_edges"], rtol=1e-6)
        assert (r["underflow"], r["overflow"]) == (w["underflow"], w["overflow"])
    # a target with one value per step has no std: null in the file, NaN when read back
    sink = JSONLSink(tmp_path / "one.jsonl")
    sink.write(0, [{"target": "t:output", "module": "t", "kind": "output", "leaf": "", "count": 1, "std": math.nan}])
    sink.close()
    assert json.loads(open(tmp_path / "one.jsonl").readlines()[1])["std"] is None
    assert math.isnan(read_jsonl(tmp_path / "one.jsonl")[0][0][1]["std"])


def test_readers_reject_files_that_are_not_ours(tmp_path):
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a hookstats CSV"):
        read_csv(bad)
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"a": 1}\n[1]\n')
    with pytest.raises(ValueError, match="x.jsonl: not a hookstats JSONL history"):
        read_jsonl(bad)
    # a whole line that is not a record among records: skipped with one warning naming it (test_report_files.py)
    bad.write_text('{"type": "stats", "step": 0, "target": "a"}\n{"a": 1}\n')
    with pytest.warns(UserWarning, match=r"x.jsonl:2: field 'type': must be 'stats', 'alert', 'run' or 'step_end': "
                                         r"missing; line skipped"):
        assert len(read_jsonl(bad)[0]) == 1


def torn_run(tmp_path, steps=4):
    """A run's CSV and JSONL files, their lines, and the oracle's records."""
    paths = tmp_path / "h.csv", tmp_path / "h.jsonl"
    mon, want = train([CSVSink(paths[0]), JSONLSink(paths[1])], steps=steps)
    return paths, [p.read_bytes().split(b"\n")[:-1] for p in paths], want


def read_quietly(reader, path, incomplete=None):
    """The reader's result and its SkippedLinesWarning messages; no other warning, but with `incomplete` (a
    step) the one saying that step is incomplete."""
    from hookstats.sinks.runs import RunsWarning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = reader(path)
    skipped = [str(w.message) for w in caught if issubclass(w.category, SkippedLinesWarning)]
    runs = [str(w.message) for w in caught if issubclass(w.category, RunsWarning)]
    assert len(skipped) <= 1 and len(caught) == len(skipped) + len(runs)
    if incomplete is None:
        assert not runs
    else:
        assert len(runs) == 1 and f"step(s) {incomplete} incomplete" in runs[0]
    return got, skipped


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_readers_skip_torn_lines_anywhere_and_keep_every_whole_record(tmp_path, fmt):
    (csv_path, jsonl_path), (csv_lines, jsonl_lines), want = torn_run(tmp_path)
    path, lines, reader = (csv_path, csv_lines, read_csv) if fmt == "csv" else (jsonl_path, jsonl_lines, read_jsonl)
    sep = b"\r\n" if fmt == "csv" else b"\n"
    lines = [ln.rstrip(b"\r") for ln in lines]
    body = lines[1:] if fmt == "csv" else lines
    head = [lines[0]] if fmt == "csv" else []
    k = len(body) // 2
    # a middle line torn and glued to the next (a second writer, a copy cut short), a torn last line
    # (the run died while writing), a torn multi-byte character
    torn = head + body[:k] + [body[k][: len(body[k]) // 2] + body[k + 1]] + body[k + 2:-1]
    data = sep.join(torn) + sep + b"\xe2\x82" + sep + body[-1][:-3]
    path.write_bytes(data)
    # the last line is the last step's end marker: that step is incomplete, said and left out
    last = int(json.loads(body[-1])["step"] if fmt == "jsonl" else body[-1].split(b",")[0])
    (items, _), skipped = read_quietly(reader, path, incomplete=last)
    assert len(skipped) == 1 and "skipped 3 line(s)" in skipped[0] and str(path) in skipped[0]
    # every whole record is read: compare with the oracle record by record
    if fmt == "jsonl":
        kept = [ln for ln in body[:k] + body[k + 2:-1] if json.loads(ln)["type"] == "stats" and
                json.loads(ln)["step"] != last]
    else:
        kept = [ln for ln in body[:k] + body[k + 2:-1] if ln.split(b",")[1] and int(ln.split(b",")[0]) != last]
    if fmt == "jsonl":
        assert len(items) == len(kept)
    got = {(s, r["target"]): r for s, r in items}
    for (s, t), r in got.items():
        if t == "0:output":
            w = want[s]
            for stat in ("mean", "std", "near_zero"):
                if stat in r:
                    np.testing.assert_allclose(r[stat], w[stat], rtol=1e-6)
    n_values = sum(len([k for k in r if k in ("count", "finite", "mean", "std", "rms", "l2", "near_zero", "nan",
                                               "posinf", "neginf", "moments_overflow", "underflow", "overflow",
                                               "running_min", "running_max", "hist_count")])
                   for r in got.values())
    assert n_values == (len(kept) if fmt == "csv" else 16 * len(kept))


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_readers_take_empty_files_and_a_header_only(tmp_path, fmt):
    path = tmp_path / f"h.{fmt}"
    path.write_bytes(b"")
    assert read_quietly(read_csv if fmt == "csv" else read_jsonl, path) == (([], []), [])
    if fmt == "csv":
        path.write_bytes(b"step,target,module,kind,leaf,stat,value\r\n")
        assert read_quietly(read_csv, path) == (([], []), [])
        path.write_bytes(b"step,target,mod")  # the header itself torn: nothing whole in the file
        with pytest.raises(ValueError, match="h.csv:1: not a whole CSV row; the file holds no whole record"):
            read_csv(path)
    else:
        path.write_bytes(b'{"type": "stats", "st')
        with pytest.raises(ValueError, match="h.jsonl:1: not JSON; the file holds no whole record"):
            read_jsonl(path)


def test_report_reads_a_run_with_torn_files_and_says_so_in_one_line(tmp_path, capsys):
    from hookstats.tools import cli
    run = tmp_path / "run"
    train(run_dir_sinks(run, tensorboard=False), steps=4)
    for name in ("history.csv", "history.jsonl"):
        p = run / name
        p.write_bytes(p.read_bytes()[:-7])
    assert cli.main(["report", str(run), "--out", str(tmp_path / "charts")]) == 0
    # the torn line, and the last step it belonged to: incomplete, left out (tests/test_report_files.py)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(e.startswith("hookstats report: warning: ") and "history.jsonl" in e for e in err)
    assert "skipped 1 line(s)" in err[0] and "step(s) 3 incomplete" in err[1]
    (run / "history.jsonl").unlink()
    assert cli.main(["report", str(run), "--out", str(tmp_path / "charts")]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "history.csv: skipped 1 line(s)" in err[0] and "step(s) 3 incomplete" in err[1]


def tb_events(path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(path), size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    acc.Reload()
    return acc


def check_tb_histograms(acc, tag, want):
    """The hist and log2_abs histograms of `tag` in TensorBoard's reader against the oracle's records."""
    hists = acc.Histograms(f"{tag}/hist")
    assert len(hists) == len(want)
    for ev, w in zip(hists, want):
        h = ev.histogram_value
        assert list(h.bucket) == [w["underflow"], *w["hist"], w["overflow"]]
        np.testing.assert_allclose(list(h.bucket_limit)[:-1], w["hist_edges"], rtol=1e-6)
        assert h.num == w["finite"]
        assert h.sum == pytest.approx(w["mean"] * w["finite"], rel=1e-5)
    logs = acc.Histograms(f"{tag}/log2_abs")
    assert len(logs) == len(want)
    for ev, w in zip(logs, want):
        h = ev.histogram_value
        nz = np.flatnonzero(w["log2_hist"][1:])
        assert list(h.bucket) == list(w["log2_hist"][1:][nz[0]: nz[-1] + 1])
        assert h.bucket_limit[0] == nz[0] - 126  # slot 2+k holds |x| in [2**(k-126), 2**(k-125))


def test_tensorboard_event_files_read_back_with_tensorboards_reader(tmp_path):
    mon, want = train([TensorBoardSink(tmp_path)], steps=4)
    acc = tb_events(tmp_path)
    tags = acc.Tags()
    # one section: every tag under hookstats/; the default statistics only (not count, finite, underflow...)
    assert all(t.startswith("hookstats/") for t in tags["scalars"] + tags["histograms"])
    assert sorted(tags["scalars"]) == sorted(f"hookstats/{t}/{k}/{s}" for t in ("0", "2")
                                             for k in ("output",) for s in ("mean", "std", "near_zero", "nonfinite"))
    means = acc.Scalars("hookstats/0/output/mean")
    assert [e.step for e in means] == [0, 1, 2, 3]
    np.testing.assert_allclose([e.value for e in means], [w["mean"] for w in want], rtol=1e-5)
    np.testing.assert_allclose([e.value for e in acc.Scalars("hookstats/0/output/near_zero")],
                               [w["near_zero"] for w in want], rtol=1e-6)
    assert [e.value for e in acc.Scalars("hookstats/0/output/nonfinite")] == [0] * 4
    check_tb_histograms(acc, "hookstats/0/output", want)


def test_tensorboard_sink_takes_a_writer_and_a_choice_of_statistics(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    from hookstats.alerts import AlertWarning
    writer = SummaryWriter(str(tmp_path))
    sink = TensorBoardSink(writer=writer, stats=("std", "running_max", "nonfinite"), prefix="mon/")
    with pytest.warns(AlertWarning):
        mon, want = train([sink], steps=3, nan_at=1)
    writer.add_scalar("after", 1.0, 0)  # the writer stays the caller's: close() flushed it, did not close it
    writer.close()
    acc = tb_events(tmp_path)
    assert sorted(t for t in acc.Tags()["scalars"] if t.startswith("mon/0/")) == \
        ["mon/0/output/nonfinite", "mon/0/output/running_max", "mon/0/output/std"]
    assert "after" in acc.Tags()["scalars"]
    assert [e.value for e in acc.Scalars("mon/0/output/nonfinite")] == [w["nan"] + w["posinf"] + w["neginf"]
                                                                        for w in want] == [0, 7, 0]
    np.testing.assert_allclose([e.value for e in acc.Scalars("mon/0/output/running_max")],
                               np.maximum.accumulate([w["max"] for w in want]), rtol=1e-6)
    check_tb_histograms(acc, "mon/0/output", want)
    none = TensorBoardSink(tmp_path / "none", stats=(), histograms=False)
    none.write(0, [{"target": "t:output", "mean": 1.0, "finite": 1, "hist": np.ones(3)}])
    none.close()
    assert tb_events(tmp_path / "none").Tags()["scalars"] == []


def test_sink_arguments_are_checked():
    with pytest.raises(ValueError, match="log_dir or writer"):
        TensorBoardSink()
    with pytest.raises(ValueError, match="log_dir or writer"):
        TensorBoardSink("x", writer=object())
    with pytest.raises(ValueError, match=r"unknown statistic\(s\) \['avg'\]"):
        TensorBoardSink(writer=object(), stats=("mean", "avg"))


def test_tensorboard_gets_the_alerts_as_text(tmp_path):
    from hookstats.alerts import AlertWarning
    with pytest.warns(AlertWarning):
        mon, _ = train([TensorBoardSink(tmp_path)], steps=4, nan_at=2)
    acc = tb_events(tmp_path)
    texts = [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors("hookstats/alerts/text_summary")]
    nonfinite = [a for a in mon.alerts if a["kind"] == "nonfinite"]
    assert nonfinite and [(a["step"], a["message"]) for a in mon.alerts] == texts
    assert texts[0][0] == 2 and "NaN/Inf in 0:output at step 2" in texts[0][1]


def test_run_dir_sinks_write_what_report_reads(tmp_path):
    train(run_dir_sinks(tmp_path), steps=3)
    assert (tmp_path / "history.csv").exists() and (tmp_path / "history.jsonl").exists()
    assert glob.glob(str(tmp_path / "tensorboard" / "events.out.tfevents.*"))


def check_wandb_histograms(row, base, w):
    """Both histograms of one W&B history row against the oracle's record."""
    lin = (row[f"{base}/hist/values"], row[f"{base}/hist/bins"])
    assert lin[0] == [w["underflow"], *map(int, w["hist"]), w["overflow"]]
    np.testing.assert_allclose(lin[1][1:-1], w["hist_edges"], rtol=1e-6)
    nz = np.flatnonzero(w["log2_hist"][1:])
    values, bins = row[f"{base}/log2_abs/values"], row[f"{base}/log2_abs/bins"]
    assert values == list(w["log2_hist"][1:][nz[0]: nz[-1] + 1])
    assert bins == list(range(nz[0] - 127, nz[-1] - 126 + 1))  # slot 2+k: log2|x| in [k-126, k-125)


def test_wandb_offline_run_holds_the_steps(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from hookstats.sinks import WandbSink
    monkeypatch.setenv("WANDB_SILENT", "true")
    sink = WandbSink(mode="offline", dir=str(tmp_path), project="hookstats-test")
    run = sink.run
    mon, want = train([sink], steps=3)
    rows = offline_history(run, min_rows=3)
    assert [r["hookstats/step"] for r in rows] == [0, 1, 2]
    np.testing.assert_allclose([r["hookstats/0/output/mean"] for r in rows], [w["mean"] for w in want], rtol=1e-6)
    assert {k.rsplit("/", 1)[1] for k in rows[0] if k.startswith("hookstats/0/output/") and "hist" not in k
            and "log2" not in k} == {"mean", "std", "near_zero", "nonfinite"}
    for r, w in zip(rows, want):
        check_wandb_histograms(r, "hookstats/0/output", w)


def test_wandb_sink_beside_the_users_own_wandb_log(tmp_path, monkeypatch):
    """The user logs each step to the same run; hookstats flushes every 2 steps, after the user's rows of
    those steps: W&B used to drop every hookstats row ("step less than the current step")."""
    wandb = pytest.importorskip("wandb")
    from hookstats.sinks import WandbSink
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(mode="offline", dir=str(tmp_path), project="hookstats-test")
    try:
        torch.manual_seed(0)
        model = nn.Linear(4, 3)
        mon = hookstats.attach(model, steps="manual", sinks=[WandbSink(run=run)], log_every=2, grads=False)
        outs = []
        for s in range(5):
            x = torch.randn(8, 4)
            with torch.no_grad():
                outs.append(model(x).double())
            run.log({"loss": float(s)})
            mon.step()
        mon.remove()
        assert run.settings.mode == "offline" and wandb.run is run  # the sink leaves the user's run open
    finally:
        run.finish()
    rows = offline_history(run, min_rows=10)
    assert [r["loss"] for r in rows if "loss" in r] == [0, 1, 2, 3, 4]
    ours = [r for r in rows if "hookstats/step" in r]
    assert [r["hookstats/step"] for r in ours] == [0, 1, 2, 3, 4]
    for r, o in zip(ours, outs):
        np.testing.assert_allclose(r["hookstats/Linear/output/mean"], o.mean().item(), rtol=1e-6)
        np.testing.assert_allclose(r["hookstats/Linear/output/std"], o.std().item(), rtol=1e-6)


def test_collect_takes_the_memory_sink_a_file_or_a_run_folder(tmp_path):
    from hookstats.tools import plots
    mem = MemorySink()
    mon, want = train([mem, *run_dir_sinks(tmp_path, tensorboard=False)], steps=4)
    for source in (mem, tmp_path, tmp_path / "history.jsonl", str(tmp_path / "history.csv"), list(mem.items())):
        series = plots.collect(source)
        assert list(series) == ["0:output", "2:output"]
        s = series["0:output"]
        assert list(s["steps"]) == [0, 1, 2, 3]
        np.testing.assert_allclose(s["mean"], [w["mean"] for w in want], rtol=1e-6)
        if not str(source).endswith(".csv"):
            np.testing.assert_array_equal(s["hist"], np.stack([w["hist"] for w in want]))
    with pytest.raises(TypeError, match="collect takes a MemorySink"):
        plots.collect(read_jsonl(tmp_path / "history.jsonl"))  # (items, alerts): not pairs
    with pytest.raises(TypeError, match="collect takes a MemorySink"):
        plots.collect({"0:output": {}})


def test_csv_alerts_file_with_a_torn_line(tmp_path):
    from hookstats.alerts import AlertWarning
    path = tmp_path / "h.csv"
    with pytest.warns(AlertWarning):
        mon, _ = train([CSVSink(path)], steps=4, nan_at=1)
    alerts_path = tmp_path / "h_alerts.csv"
    whole = alerts_path.read_bytes()
    alerts_path.write_bytes(whole + b"3,2:output,nonfin")
    (items, alerts), skipped = read_quietly(read_csv, path)
    assert len(skipped) == 1 and "h_alerts.csv: skipped 1 line(s)" in skipped[0]
    assert [(a["step"], a["target"], a["kind"]) for a in alerts] == \
        [(a["step"], a["target"], a["kind"]) for a in mon.alerts]


def test_statistics_table_keeps_the_record_and_file_formats():
    """The table (hookstats/statistics.py) decides what records hold and what files get: pinned here, so a
    new row is a deliberate format change."""
    from hookstats import statistics, whatif
    from hookstats.sinks.memory import FLOATS, HISTS, INTS
    floats = ("near_zero_rel", "near_zero_rel_threshold", "p0_1", "p1", "p50", "p99", "p99_9", "abs_p0_1", "abs_p1",
              "abs_p50", "abs_p99", "abs_p99_9", *whatif.field_names(), "hist_count")
    assert statistics.SCALARS == ("count", "finite", "mean", "std", "rms", "l2", "near_zero", *floats, "nan", "posinf", "neginf",
                                  "moments_overflow", "underflow", "overflow", "running_min", "running_max")
    assert statistics.DASHBOARD_STATS == ("mean", "std", "near_zero", "near_zero_rel", "nonfinite")
    assert statistics.DASHBOARD_CHOICES == statistics.SCALARS + ("nonfinite",)
    assert statistics.names(statistics.STATS) == (
        "count", "finite", "mean", "std", "var", "rms", "l2", "min", "max", "near_zero", "near_zero_count", *floats, "nan",
        "posinf", "neginf", "moments_overflow", "underflow", "overflow", "hist", "hist_edges", "log2_hist", "float_hist")
    assert statistics.names(statistics.HISTORY) == tuple(
        k for k in statistics.names(statistics.STATS) if k not in ("min", "max")) + ("running_min", "running_max")
    assert INTS == ("count", "finite", "near_zero_count", "nan", "posinf", "neginf", "moments_overflow")
    # underflow/overflow: NaN on history steps that counted no histograms (hist_every)
    assert FLOATS == ("mean", "std", "var", "rms", "l2", "near_zero", *floats, "underflow", "overflow", "running_min", "running_max")
    assert HISTS == ("hist", "log2_hist", "float_hist")


def test_callbacks_windows_without_a_histogram_step_get_no_linear_histogram(tmp_path):
    """The HF/Lightning callbacks' windows (stats() then reset(), integrations/metrics.py) with the linear bins and
    hist_every=10, one step a window: the windows of steps 0, 1 and 2 (the grid and the ramp) get a `hist` whose
    counts are that step's values (the test's own hook, NumPy's bins, under/overflow as the outer buckets); the
    window of step 3 counted no histogram and gets none in TensorBoard and W&B (not one of zero counts claiming
    `finite` values)."""
    from torch.utils.tensorboard import SummaryWriter

    from hookstats.integrations.metrics import measured, tensorboard_histograms, window_stats
    torch.manual_seed(0)
    lin = nn.Linear(4, 50)
    seen = []
    lin.register_forward_hook(lambda m, i, o: seen.append(o.detach().double().reshape(-1).numpy()))
    mon = hookstats.attach(lin, linear_hist=True, float_hist=False, log_hist=False, lo=-1.0, hi=1.0, nbins=8,
                           grads=False, hist_every=10, alerts=False)
    writer = SummaryWriter(str(tmp_path))
    got_wandb, outer = [], []
    for step in range(4):
        with torch.no_grad():
            lin(torch.randn(2, 4))
        mon.step()
        targets = list(measured(window_stats(mon)))
        outer.append([(r["underflow"], r["overflow"]) for _, r in targets])
        tensorboard_histograms(writer, targets, step)
        wandb = pytest.importorskip("wandb")
        got_wandb.append(sorted(hookstats.sinks.wandb.histograms(wandb, targets)))
    mon.remove()
    writer.close()
    events = tb_events(tmp_path).Histograms("hookstats/Linear/output/hist")
    assert [ev.step for ev in events] == [0, 1, 2]
    for ev in events:
        v = seen[ev.step]
        want = [(v < -1).sum(), *np.histogram(v[(v >= -1) & (v < 1)], bins=8, range=(-1, 1))[0], (v >= 1).sum()]
        assert list(ev.histogram_value.bucket) == want and ev.histogram_value.num == v.size
        assert outer[ev.step] == [(want[0], want[-1])]
    assert got_wandb == [["hookstats/Linear/output/hist"]] * 3 + [[]]
    assert np.isnan(outer[3][0]).all()  # unknown, not 0
