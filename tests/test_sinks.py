"""Sinks: what each writes is read back with an independent reader (csv, json, TensorBoard's own
EventAccumulator, W&B's offline run file) and compared with a float64 NumPy oracle of each step's tensors."""
import glob
import json
import math
import struct
import time

import numpy as np
import pytest
import torch
from helpers import oracle
from torch import nn

import hookstats
from hookstats.sinks import CSVSink, JSONLSink, MemorySink, TensorBoardSink, read_csv, read_jsonl, run_dir_sinks
from hookstats.stats import finalize

pytestmark = pytest.mark.filterwarnings("error::hookstats.history.HistoryWarning")


def train(sinks, steps=5, nan_at=None, log_every=2):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
    mon = hookstats.attach(model, steps="manual", sinks=sinks, log_every=log_every, nbins=10, lo=-3, hi=3)
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


def test_csv_long_table_round_trip(tmp_path):
    path = tmp_path / "h.csv"
    mon, want = train([CSVSink(path)], nan_at=3)
    with open(path) as f:
        header = f.readline().strip()
    assert header == "step,target,module,kind,leaf,stat,value"
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
    assert {line["type"] for line in lines} == {"stats"}
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
    assert json.loads(open(tmp_path / "one.jsonl").readline())["std"] is None
    assert math.isnan(read_jsonl(tmp_path / "one.jsonl")[0][0][1]["std"])


def test_readers_reject_files_that_are_not_ours(tmp_path):
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a hookstats CSV"):
        read_csv(bad)
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"type": "stats", "step": 0, "target": "a"}\nnot json\n')
    with pytest.raises(ValueError, match="x.jsonl:2: not JSON"):
        read_jsonl(bad)


def test_tensorboard_event_files_read_back_with_tensorboards_reader(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    mon, want = train([TensorBoardSink(tmp_path)], steps=4)
    acc = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    tags = acc.Tags()
    assert "0:output/mean" in tags["scalars"] and "0:output/hist" in tags["histograms"]
    means = acc.Scalars("0:output/mean")
    assert [e.step for e in means] == [0, 1, 2, 3]
    np.testing.assert_allclose([e.value for e in means], [w["mean"] for w in want], rtol=1e-5)
    for ev, w in zip(acc.Histograms("0:output/hist"), want):
        h = ev.histogram_value
        counts = [w["underflow"], *w["hist"], w["overflow"]]
        assert list(h.bucket) == counts
        np.testing.assert_allclose(list(h.bucket_limit)[:-1], w["hist_edges"], rtol=1e-6)
        assert h.num == w["finite"]
        assert h.sum == pytest.approx(w["mean"] * w["finite"], rel=1e-5)
    for ev, w in zip(acc.Histograms("0:output/log2_abs"), want):
        h = ev.histogram_value
        nz = np.flatnonzero(w["log2_hist"][1:])
        assert list(h.bucket) == list(w["log2_hist"][1:][nz[0]: nz[-1] + 1])
        assert h.bucket_limit[0] == nz[0] - 126  # slot 2+k holds |x| in [2**(k-126), 2**(k-125))


def test_tensorboard_gets_the_alerts_as_text(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from hookstats.alerts import AlertWarning
    with pytest.warns(AlertWarning):
        mon, _ = train([TensorBoardSink(tmp_path)], steps=4, nan_at=2)
    acc = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0})
    acc.Reload()
    texts = [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors("alerts/text_summary")]
    nonfinite = [a for a in mon.alerts if a["kind"] == "nonfinite"]
    assert nonfinite and [(a["step"], a["message"]) for a in mon.alerts] == texts
    assert texts[0][0] == 2 and "NaN/Inf in 0:output at step 2" in texts[0][1]


def test_run_dir_sinks_write_what_report_reads(tmp_path):
    train(run_dir_sinks(tmp_path), steps=3)
    assert (tmp_path / "history.csv").exists() and (tmp_path / "history.jsonl").exists()
    assert glob.glob(str(tmp_path / "tensorboard" / "events.out.tfevents.*"))


def read_wandb_history(path):
    """History rows of an offline .wandb file: LevelDB-style log records holding wandb Record protobufs."""
    from wandb.proto import wandb_internal_pb2 as pb
    data = open(path, "rb").read()
    pos, block, pieces, rows = 7, 32768, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, n, kind = struct.unpack("<IHB", data[pos: pos + 7])
        if kind == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7: pos + 7 + n], pos + 7 + n
        pieces = chunk if kind in (1, 2) else pieces + chunk
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(pieces)
            if rec.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
    return rows


def test_wandb_offline_run_holds_the_steps(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from hookstats.sinks import WandbSink
    monkeypatch.setenv("WANDB_SILENT", "true")
    sink = WandbSink(mode="offline", dir=str(tmp_path), project="hookstats-test")
    mon, want = train([sink], steps=3)
    (run_file,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    deadline = time.monotonic() + 20
    while len(rows := read_wandb_history(run_file)) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)  # wandb-core may still be writing the file after run.finish() returns
    assert [r["_step"] for r in rows] == [0, 1, 2]
    np.testing.assert_allclose([r["0:output/mean"] for r in rows], [w["mean"] for w in want], rtol=1e-6)
    assert rows[0]["0:output/hist/values"] == [int(c) for c in want[0]["hist"]]
