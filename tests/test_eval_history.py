"""Validation passes reach every place the train steps reach: a train + validate-every-epoch loop with
attach(eval=True), read back from mon.history(), the JSONL and CSV files, TensorBoard (its own reader), W&B (an
offline run file) and `hookstats report`, against the test's own float64 hooks for both phases. A pass is the eval
forwards between two train steps, stamped with the step they ran in (the last train step before them)."""
import numpy as np
import pytest
import torch
from float_oracle import float_counts
from torch import nn
from wandb_file import offline_history

import hookstats
from hookstats.sinks import CSVSink, JSONLSink, TensorBoardSink, read_csv, read_jsonl

EPOCHS, STEPS, VAL_BATCHES = 3, 4, 2
STATS = ("mean", "std", "rms", "l2")


class Net(nn.Sequential):
    def __init__(self):
        torch.manual_seed(0)
        super().__init__(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3))


def loop(sinks, log_every=3):
    """Trains EPOCHS epochs of STEPS steps, validating after each; returns the monitor and the oracle's values
    {(phase, step, target): float64 array}."""
    model = Net()
    seen = {}
    step = [0]

    def hook(name):
        def fn(m, args, out):
            phase = "train" if model.training else "eval"
            at = step[0] if phase == "train" else step[0] - 1  # a pass is stamped with the step it follows
            seen.setdefault((phase, at, f"{name}:output"), []).append(out.detach().double().reshape(-1).numpy())
        return fn

    for name in ("0", "2"):
        model.get_submodule(name).register_forward_hook(hook(name))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    mon = hookstats.attach(model, eval=True, history=True, log_every=log_every, sinks=sinks, grads=False,
                           alerts=False)
    g = torch.Generator().manual_seed(1)
    for _ in range(EPOCHS):
        model.train()
        for _ in range(STEPS):
            model(torch.randn(8, 5, generator=g)).square().mean().backward()
            opt.step()
            opt.zero_grad()
            step[0] += 1
        model.eval()
        with torch.no_grad():
            for _ in range(VAL_BATCHES):
                model(torch.randn(6, 5, generator=g) * 3)  # another scale: train and eval differ
    return mon, {k: np.concatenate(v) for k, v in seen.items()}


def want(x):
    return {"count": x.size, "mean": x.mean(), "std": x.std(ddof=1), "rms": np.sqrt(np.mean(x * x)),
            "l2": np.linalg.norm(x)}


def check(got, oracle, what):
    """got {(phase, step, target): {stat: value}} against the oracle, for every (phase, step, target) of it."""
    assert set(got) == set(oracle), f"{what}: {sorted(set(got) ^ set(oracle))[:6]}"
    for k, x in oracle.items():
        w = want(x)
        for stat in STATS:
            np.testing.assert_allclose(got[k][stat], w[stat], rtol=1e-5, err_msg=f"{what} {k} {stat}")
        if "count" in got[k]:
            assert got[k]["count"] == w["count"], (what, k)


def test_validation_passes_in_history_files_tensorboard_and_report(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    sinks = [JSONLSink(tmp_path / "history.jsonl"), CSVSink(tmp_path / "history.csv"),
             TensorBoardSink(tmp_path / "tensorboard")]
    mon, oracle = loop(sinks)
    passes = {k for k in oracle if k[0] == "eval"}
    assert {k[1] for k in passes} == {STEPS - 1, 2 * STEPS - 1, 3 * STEPS - 1}
    frame = mon.history()  # read before remove(): the last pass is in it
    got = {}
    for (phase, step, target, stat), v in frame.set_index(["phase", "step", "target", "stat"])["value"].items():
        got.setdefault((phase, step, target), {})[stat] = v
    check(got, oracle, "history()")
    mon.remove()
    for reader, name in ((read_jsonl, "history.jsonl"), (read_csv, "history.csv")):
        items, _ = reader(tmp_path / name)
        check({(r["phase"], s, r["target"]): r for s, r in items}, oracle, name)
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    tb = {}
    for tag in acc.Tags()["scalars"]:
        parts = tag.split("/")  # hookstats/<module>/<kind>[/eval]/<stat>
        phase = "eval" if parts[-2] == "eval" else "train"
        for e in acc.Scalars(tag):
            tb.setdefault((phase, e.step, f"{parts[1]}:{parts[2]}"), {})[parts[-1]] = e.value
    tb_oracle = {k: v for k, v in oracle.items()}
    assert set(tb) == set(tb_oracle)
    for k, x in oracle.items():
        w = want(x)
        for stat in ("mean", "std"):
            np.testing.assert_allclose(tb[k][stat], w[stat], rtol=1e-5, err_msg=f"tensorboard {k} {stat}")
    # the eval histograms too, beside the train ones
    hists = acc.Tags()["histograms"]
    assert "hookstats/0/output/eval/hist" in hists and "hookstats/0/output/hist" in hists
    assert sorted(e.step for e in acc.Histograms("hookstats/0/output/eval/hist")) == sorted(k[1] for k in passes
                                                                                        if k[2] == "0:output")
    from hookstats.tools.cli import report
    lines = []
    report(tmp_path, log=lines.append)
    table = "\n".join(lines)
    assert "0:output (eval)" in table and "2:output (eval)" in table


def test_validation_passes_reach_a_wandb_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from hookstats.sinks import WandbSink
    monkeypatch.setenv("WANDB_SILENT", "true")
    sink = WandbSink(mode="offline", dir=str(tmp_path), project="hookstats-test")
    run = sink.run
    mon, oracle = loop([sink])
    mon.remove()
    rows = offline_history(run, min_rows=EPOCHS * STEPS + EPOCHS)
    got = {}
    for r in rows:
        for key, v in r.items():
            parts = key.split("/")
            if len(parts) < 4 or parts[-1] not in ("mean", "std"):
                continue
            phase = "eval" if parts[-2] == "eval" else "train"
            got.setdefault((phase, r["hookstats/step"], f"{parts[1]}:{parts[2]}"), {})[parts[-1]] = v
    assert set(got) == set(oracle)
    for k, x in oracle.items():
        w = want(x)
        for stat in ("mean", "std"):
            np.testing.assert_allclose(got[k][stat], w[stat], rtol=1e-5, err_msg=f"wandb {k} {stat}")


@pytest.mark.parametrize("log_every", [1, 5, 100])
def test_each_pass_is_its_own_record_whatever_the_flush_window(log_every):
    """A pass after every epoch, flushes every 1, 5 or 100 steps: one eval record per pass, each of that
    pass's forwards only (the eval state keeps the open pass apart, as train states keep the open step), its float
    buckets too (a pass counts them always; with log_every=100 one window holds every pass)."""
    mon, oracle = loop([], log_every=log_every)
    mon.remove()
    got = {(r["phase"], s, r["target"]): r for s, r in mon.history_sink.items()}
    check(got, oracle, f"log_every={log_every}")
    passes = [k for k in oracle if k[0] == "eval"]
    assert len(passes) == 2 * EPOCHS
    for k in passes:
        np.testing.assert_array_equal(got[k]["float_hist"], float_counts(oracle[k].astype(np.float32)), err_msg=str(k))
