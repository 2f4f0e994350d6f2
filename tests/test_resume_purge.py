"""A run resumed into the same folder from a checkpoint older than the first run's last step supersedes the steps
after its checkpoint in every sink, as TensorBoard's purge_step does: our readers, TensorBoard's EventAccumulator
and pandas on the CSV each see every step once, with the resumed run's values. Checked against the test's own
float64 hooks in both processes."""
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch

import hookstats
from hookstats.sinks import CSVSink, JSONLSink, TensorBoardSink, read_csv, read_jsonl

from resume_loop import LOOP

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGETS = ("0:output", "2:output", "0:grad_output", "2:grad_output")
CKPT_AT, FIRST_END, SECOND_END = 14, 24, 30  # the checkpoint holds steps 0..14


FIRST = LOOP + textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    import hookstats
    from hookstats.sinks import CSVSink, JSONLSink, TensorBoardSink
    model, opt = make()
    seen, clock = [], [0]
    own_hooks(model, seen, clock)
    mon = hookstats.attach(model, sinks=[JSONLSink({jsonl!r}), CSVSink({csv!r}), TensorBoardSink({tb!r})],
                           log_every=4, alerts=False)
    train(model, opt, range({at} + 1), clock, 1)
    torch.save({{"model": model.state_dict(), "opt": opt.state_dict(), "mon": mon.state_dict()}}, {ckpt!r})
    torch.save(seen, {seen!r})
    train(model, opt, range({at} + 1, {end} + 1), clock, 1)  # steps the resumed run will write again
    mon.remove()
""")


def per_step(seen):
    out = {}
    for step, target, v in seen:
        out.setdefault((step, target), []).append(v.numpy())
    return {k: np.concatenate(v) for k, v in out.items()}


def check_mean(got, v):
    np.testing.assert_allclose(got, v.mean(), rtol=1e-6, atol=1e-6 * np.abs(v).max())  # float32 block sums


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resume")
    run = tmp / "run"
    paths = {"jsonl": str(run / "h.jsonl"), "csv": str(run / "h.csv"), "tb": str(run / "tb"),
             "ckpt": str(tmp / "ckpt.pt"), "seen": str(tmp / "seen.pt")}
    r = subprocess.run([sys.executable, "-c", FIRST.format(root=ROOT, at=CKPT_AT, end=FIRST_END, **paths)],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    first = per_step(torch.load(paths["seen"], weights_only=False))
    assert max(s for s, _ in first) == CKPT_AT  # the oracle holds what the checkpoint holds

    ns = {}
    exec(LOOP, ns)
    model, opt = ns["make"]()
    ckpt = torch.load(paths["ckpt"], map_location="cpu", weights_only=True)
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])
    seen, clock = [], [0]
    ns["own_hooks"](model, seen, clock)
    mon = hookstats.attach(model, sinks=[JSONLSink(paths["jsonl"]), CSVSink(paths["csv"]),
                                         TensorBoardSink(paths["tb"])], log_every=4, alerts=False)
    mon.load_state_dict(ckpt["mon"])
    assert mon.step_count == CKPT_AT + 1
    ns["train"](model, opt, range(CKPT_AT + 1, SECOND_END + 1), clock, 2)
    mon.remove()
    return paths, {**first, **per_step(seen)}


def test_the_expected_steps_are_those_of_both_processes(resumed):
    _, want = resumed
    assert sorted({s for s, _ in want}) == list(range(SECOND_END + 1))


@pytest.mark.parametrize("reader", [read_jsonl, read_csv])
def test_our_readers_see_each_step_once_with_the_resumed_values(resumed, reader):
    paths, want = resumed
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        items, _ = reader(paths["jsonl" if reader is read_jsonl else "csv"])
    assert not [w for w in caught if "more than once" in str(w.message)]
    keys = [(s, r["target"]) for s, r in items]
    assert sorted(keys) == sorted(want) and len(set(keys)) == len(keys)
    for step, rec in items:
        check_mean(rec["mean"], want[(step, rec["target"])])


def test_the_jsonl_file_holds_each_step_once(resumed):
    import json
    paths, want = resumed
    lines = [json.loads(ln) for ln in open(paths["jsonl"])]
    keys = [(ln["step"], ln["target"]) for ln in lines if ln["type"] == "stats"]
    assert sorted(keys) == sorted(want)
    ends = [ln["step"] for ln in lines if ln["type"] == "step_end"]
    assert sorted(ends) == list(range(SECOND_END + 1))


def test_pandas_on_the_csv_sees_each_step_once_with_the_resumed_values(resumed):
    pd = pytest.importorskip("pandas")
    paths, want = resumed
    df = pd.read_csv(paths["csv"], keep_default_na=False)
    means = df[(df["target"] != "") & (df["stat"] == "mean")]
    keys = list(zip(means["step"].astype(int), means["target"]))
    assert sorted(keys) == sorted(want) and len(set(keys)) == len(keys)
    for (step, target), v in zip(keys, means["value"].astype(float)):
        check_mean(v, want[(step, target)])


def test_tensorboard_sees_each_step_once_with_the_resumed_values(resumed):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    paths, want = resumed
    acc = EventAccumulator(paths["tb"], size_guidance={"scalars": 0})
    acc.Reload()
    for target in TARGETS:
        module, kind = target.split(":")
        events = acc.Scalars(f"hookstats/{module}/{kind}/mean")
        assert [e.step for e in events] == list(range(SECOND_END + 1)), target
        for e in events:
            np.testing.assert_allclose(e.value, want[(e.step, target)].mean(), rtol=1e-5, atol=1e-7)


def test_start_step_supersedes_later_steps_alerts_and_empty_runs(tmp_path):
    """attach(start_step=N) is a resume too: JSONL lines and CSV rows of steps >= N go, alerts included, and a
    run header left with no line of its own goes with them."""
    import json
    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    paths = tmp_path / "h.jsonl", tmp_path / "h.csv"
    want = {}  # step -> the mean of 0:output the last run to reach it measured

    def run(start, end, scale):
        with hookstats.attach(model, sinks=[JSONLSink(paths[0]), CSVSink(paths[1])], steps="manual", log_every=1,
                              start_step=start) as mon:
            for s in range(start, end):
                with torch.no_grad():
                    want[s] = model(torch.full((4, 3), float("nan") if s == 7 else scale)).double().mean().item()
                mon.step()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the NaN alert
        run(0, 10, 1.0)
        run(12, 14, 2.0)  # a run wholly after the next one's start: all of it superseded
        run(5, 7, 3.0)
    lines = [json.loads(ln) for ln in open(paths[0])]
    assert sorted(ln["step"] for ln in lines if ln["type"] == "step_end") == list(range(7))
    assert [ln["type"] for ln in lines].count("run") == 2
    assert not [ln for ln in lines if ln["type"] == "alert"]  # step 7's alert went with step 7
    rows = [ln.split(",") for ln in open(paths[1]).read().splitlines()[1:]]
    assert sorted({int(r[0]) for r in rows if r[1]}) == list(range(7))
    assert sum(r[3] == "#run" for r in rows) == 2
    alerts = paths[1].with_name("h_alerts.csv")
    assert alerts.exists() and alerts.read_text().splitlines()[1:] == []
    for reader, path in ((read_jsonl, paths[0]), (read_csv, paths[1])):
        items, _ = reader(path)
        assert sorted(s for s, r in items) == list(range(7))
        for s, r in items:
            np.testing.assert_allclose(r["mean"], want[s], rtol=1e-6)
    assert want[4] != want[5] and want[5] == want[6]  # steps 5, 6 measured by the last run