"""A run resumed from a checkpoint keeps its history: the sinks append, Monitor.state_dict()/load_state_dict()
carry the step and the running totals, one writer per file. Checked against the test's own float64 hooks."""
import json
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch

import hookstats
from hookstats.sinks import CSVSink, JSONLSink, read_csv, read_jsonl
from hookstats.sinks.claim import FileInUseError
from hookstats.sinks.runs import RunsWarning

from resume_loop import LOOP

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGETS = ("0:output", "2:output", "0:grad_output", "2:grad_output")


def loop():
    ns = {}
    exec(LOOP, ns)
    return ns


FIRST = LOOP + textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {root!r})
    import hookstats
    from hookstats.sinks import CSVSink, JSONLSink
    model, opt = make()
    seen, clock = [], [0]
    own_hooks(model, seen, clock)
    mon = hookstats.attach(model, sinks=[JSONLSink({jsonl!r}), CSVSink({csv!r})], log_every=4, hist_every=3,
                           alerts=False)
    train(model, opt, range({at}), clock)
    torch.save({{"model": model.state_dict(), "opt": opt.state_dict(), "mon": mon.state_dict()}}, {ckpt!r})
    torch.save(seen, {seen!r})
    train(model, opt, range({at}, {at} + 2), clock)  # steps the checkpoint does not hold, never flushed
    os.kill(os.getpid(), signal.SIGKILL)  # dies holding its sinks' locks
""")


def oracle(seen):
    """{(step, target): float64 values} and {target: all values of the run}."""
    per_step, whole = {}, {}
    for step, target, v in seen:
        per_step.setdefault((step, target), []).append(v.numpy())
        whole.setdefault(target, []).append(v.numpy())
    cat = lambda d: {k: np.concatenate(v) for k, v in d.items()}  # noqa: E731
    return cat(per_step), cat(whole)


def check_record(rec, v):
    assert rec["count"] == v.size
    np.testing.assert_allclose(rec["mean"], v.mean(), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(rec["std"], v.std(ddof=1), rtol=1e-6, atol=1e-9)


def test_a_killed_run_resumed_from_its_checkpoint_holds_every_step_once(tmp_path):
    at, total = 6, 11
    paths = {"jsonl": str(tmp_path / "run" / "h.jsonl"), "csv": str(tmp_path / "run" / "h.csv"),
             "ckpt": str(tmp_path / "ckpt.pt"), "seen": str(tmp_path / "seen.pt")}
    r = subprocess.run([sys.executable, "-c", FIRST.format(root=ROOT, at=at, **paths)], capture_output=True,
                       text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == -9, r.stderr
    assert os.path.exists(paths["jsonl"] + ".lock")  # left by the dead process

    # a fresh process's part: rebuild, load, re-attach on the same paths, continue
    ns = loop()
    model, opt = ns["make"]()
    ckpt = torch.load(paths["ckpt"], map_location="cpu", weights_only=True)
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])
    seen, clock = torch.load(paths["seen"], weights_only=False), [0]
    ns["own_hooks"](model, seen, clock)
    mon = hookstats.attach(model, sinks=[JSONLSink(paths["jsonl"]), CSVSink(paths["csv"])], log_every=4,
                           hist_every=3, alerts=False)
    mon.load_state_dict(ckpt["mon"])
    assert mon.step_count == at
    ns["train"](model, opt, range(at, total), clock)
    mon.remove()

    per_step, whole = oracle(seen)
    # the file holds every step exactly once (the dead process's unflushed steps were never written)
    lines = [json.loads(ln) for ln in open(paths["jsonl"])]
    keys = [(ln["step"], ln["target"]) for ln in lines if ln["type"] == "stats"]
    assert sorted(keys) == sorted(per_step) and len(set(keys)) == len(keys)
    assert sum(ln["type"] == "run" for ln in lines) == 2
    rows = [ln.split(",") for ln in open(paths["csv"]).read().splitlines()[1:]]
    stat_rows = [(r[0], r[1], r[5], r[6]) for r in rows if r[1]]  # step, target, phase, stat
    assert len(set(stat_rows)) == len(stat_rows)
    for reader, path in ((read_jsonl, paths["jsonl"]), (read_csv, paths["csv"])):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            items, _ = reader(path)
        said = [str(w.message) for w in caught]
        assert len(said) == 1 and "holds 2 runs" in said[0] and f"steps 0..{at - 1}" in said[0] \
            and f"steps {at}..{total - 1}" in said[0], said
        assert sorted((s, r["target"]) for s, r in items) == sorted(per_step)
        for step, rec in items:
            check_record(rec, per_step[(step, rec["target"])])
    # the running totals cover the whole run, both processes
    stats = mon.stats()
    assert set(stats) == set(TARGETS)
    for t in TARGETS:
        v = whole[t]
        check_record(stats[t], v)
        assert stats[t]["min"] == v.min() and stats[t]["max"] == v.max()
    assert not os.path.exists(paths["jsonl"] + ".lock") and not os.path.exists(paths["csv"] + ".lock")


@pytest.mark.parametrize("history", [False, True])
@pytest.mark.parametrize("steps", ["forward", "manual"])
def test_state_dict_round_trip_equals_one_uninterrupted_monitor(tmp_path, history, steps):
    """Checkpoint at step 3 of 7, every=2, eval forwards included: a monitor loaded from the state dict (saved
    and loaded with torch.save/torch.load, weights_only) ends with the stats of one that ran throughout."""
    ns = loop()

    def run(split):
        model, opt = ns["make"]()
        kw = dict(every=2, eval=True, steps=steps, history=history, hist_every=2)
        mon = hookstats.attach(model, **kw)

        def go(rng):
            for s in rng:
                ns["train"](model, opt, [s], [0])
                if steps == "manual":
                    mon.step()
                if s % 3 == 0:
                    model.eval()
                    model(torch.ones(2, 5))
                    model.train()
        go(range(0, split))
        if split < 7:
            path = tmp_path / f"mon{split}.pt"
            torch.save(mon.state_dict(), path)
            mon.remove()
            mon = hookstats.attach(model, **kw)
            mon.load_state_dict(torch.load(path, weights_only=True))
            go(range(split, 7))
        mon.remove()
        return mon

    whole, resumed = run(7), run(3)
    assert resumed.step_count == whole.step_count
    for phase in ("train", "eval"):
        a, b = whole.stats(phase), resumed.stats(phase)
        assert set(a) == set(b) and a
        for t in a:
            for k in ("count", "finite", "min", "max", "nan", "near_zero"):
                assert a[t][k] == b[t][k], (phase, t, k)
            np.testing.assert_allclose(b[t]["mean"], a[t]["mean"], rtol=1e-12)
            np.testing.assert_allclose(b[t]["std"], a[t]["std"], rtol=1e-12)
            np.testing.assert_array_equal(b[t]["float_hist"], a[t]["float_hist"])


def test_load_state_dict_names_what_differs():
    ns = loop()
    model, _ = ns["make"]()
    with hookstats.attach(model) as mon:
        model(torch.ones(2, 5)).sum().backward()
        sd = mon.state_dict()
    with hookstats.attach(model, nbins=8, lo=-1.0, hi=1.0) as other:
        with pytest.raises(ValueError, match=r"config: .*nbins=40 \(this monitor: 8\)"):
            other.load_state_dict(sd)
    with hookstats.attach(model, modules=["0"]) as other:
        with pytest.raises(ValueError, match=r"modules: only in the state dict \['2'\]"):
            other.load_state_dict(sd)
    with hookstats.attach(model, every=3) as other:
        with pytest.raises(ValueError, match=r"every: 1 \(this monitor: 3\)"):
            other.load_state_dict(sd)
    with hookstats.attach(model, param_grads=True) as other:
        with pytest.raises(ValueError, match=r"options: param_grads=False \(this monitor: True\)"):
            other.load_state_dict(sd)
        with pytest.raises(ValueError, match="not a hookstats Monitor state dict"):
            other.load_state_dict({"step": 3})
        bad = {**sd, "options": other.options, "states": [{**sd["states"][0], "istate": torch.zeros(3)}]}
        with pytest.raises(ValueError, match="istate must be a 1-d torch.int64 tensor"):
            other.load_state_dict(bad)


def test_start_step_numbers_the_records_from_there(tmp_path):
    ns = loop()
    model, opt = ns["make"]()
    mon = hookstats.attach(model, sinks=[JSONLSink(tmp_path / "h.jsonl")], start_step=40, every=3, log_every=6)
    ns["train"](model, opt, range(6), [0])
    mon.remove()
    items, _ = read_jsonl(tmp_path / "h.jsonl")
    assert sorted({s for s, _ in items}) == [42, 45]  # steps 40..45, every=3 samples 42 and 45
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="start_step"):
            hookstats.attach(model, start_step=bad)


@pytest.mark.parametrize("sink", [JSONLSink, CSVSink])
def test_a_second_writer_of_one_file_is_refused_until_the_first_closes(tmp_path, sink):
    path = tmp_path / f"h.{'jsonl' if sink is JSONLSink else 'csv'}"
    rec = {"target": "a:output", "module": "a", "kind": "output", "leaf": "", "count": 3, "mean": 1.0}
    first = sink(path)
    first.write(0, [rec])
    with pytest.raises(FileInUseError, match="is being written by this process"):
        sink(path)
    first.close()
    second = sink(path)
    second.write(0, [{**rec, "mean": 2.0}])  # the same step again: the later record wins, said
    second.close()
    reader = read_jsonl if sink is JSONLSink else read_csv
    with pytest.warns(RunsWarning) as caught:
        items, _ = reader(path)
    said = " | ".join(str(w.message) for w in caught)
    assert "holds 2 runs" in said and "1 (step, target) record(s) written more than once (steps 0)" in said \
        and "the last written of each is used" in said
    assert [(s, r["mean"]) for s, r in items] == [(0, 2.0)]


def test_a_lock_of_a_process_that_is_gone_is_taken_over_and_another_live_ones_is_not(tmp_path):
    import socket
    path = tmp_path / "h.jsonl"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock = tmp_path / "h.jsonl.lock"
    lock.write_text(json.dumps({"pid": int(dead.stdout), "host": socket.gethostname()}))
    s = JSONLSink(path)
    s.write(0, [])
    s.close()
    assert not lock.exists()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock.write_text(json.dumps({"pid": live.pid, "host": socket.gethostname()}))
        with pytest.raises(FileInUseError, match=f"process {live.pid}"):
            JSONLSink(path)
    finally:
        live.kill()
        live.wait()


def test_each_rank_writes_its_own_file(tmp_path, monkeypatch):
    import hookstats.ranks as distributed
    monkeypatch.setattr(distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(distributed, "world_size", lambda group=None: 3)
    for r in (0, 2):
        monkeypatch.setattr(distributed, "rank", lambda group=None, r=r: r)
        for sink, name in ((JSONLSink, "h.jsonl"), (CSVSink, "h.csv")):
            s = sink(tmp_path / name)
            s.write(r, [{"target": "a:output", "module": "a", "kind": "output", "leaf": "", "count": r + 1}])
            s.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.csv", "h.jsonl", "h.rank2.csv", "h.rank2.jsonl"]
    assert [s for s, _ in read_jsonl(tmp_path / "h.rank2.jsonl")[0]] == [2]


def _state(sd, target):
    return next(s for s in sd["states"] if f"{s['module']}:{s['kind']}" == target)


def _changed(sd, target, **fields):
    """sd with the state of `target` changed: fields replaced, or istate/fstate slots set by `<part>@<slot>`."""
    states = []
    for s in sd["states"]:
        s = {**s, "fstate": s["fstate"].clone(), "istate": s["istate"].clone()}
        if f"{s['module']}:{s['kind']}" == target:
            for k, v in fields.items():
                part, _, slot = k.partition("@")
                if slot:
                    s[part][int(slot)] = v
                else:
                    s[k] = v
        states.append(s)
    return {**sd, "states": states}


CHECKPOINT_DEFECTS = {  # id: (change of the state dict, the field the error names)
    "module-not-attached": (lambda sd: _changed(sd, "2:output", module="9"), "module"),
    "param-not-in-model": (lambda sd: {**sd, "states": sd["states"] + [{**_state(sd, "2:output"), "kind": "param"}]},
                           "kind"),
    "leaf-an-int": (lambda sd: _changed(sd, "2:output", leaf=5), "leaf"),
    "call-negative": (lambda sd: _changed(sd, "2:output", call=-3), "call"),
    "call-without-separate-calls": (lambda sd: _changed(sd, "2:output", call=2), "call"),
    "kind-unknown": (lambda sd: _changed(sd, "2:output", kind="weights"), "kind"),
    "phase-unknown": (lambda sd: _changed(sd, "2:output", phase="test"), "phase"),
    "negative-count": (lambda sd: _changed(sd, "2:output", **{"istate@0": -4}), "count"),
    "n-finite-above-count": (lambda sd: _changed(sd, "2:output", **{"fstate@0": 10 ** 6}), "n_finite"),
    "n-finite-fractional": (lambda sd: _changed(sd, "2:output", **{"fstate@0": 1.5}), "n_finite"),
    "near-zero-above-count": (lambda sd: _changed(sd, "2:output", **{"istate@1": 10 ** 6}), "near_zero"),
    "mean-nan": (lambda sd: _changed(sd, "2:output", **{"fstate@1": float("nan")}), "mean"),
    "m2-negative": (lambda sd: _changed(sd, "2:output", **{"fstate@2": -1.0}), "m2"),
    "min-above-max": (lambda sd: _changed(sd, "2:output", **{"fstate@3": 1e9}), "max"),
    "negative-bucket": (lambda sd: _changed(sd, "2:output", **{"istate@-1": -1}), "float_buckets"),
    "duplicate-state": (lambda sd: {**sd, "states": sd["states"] + [_state(sd, "2:output")]}, "a second state"),
    "step-past-int64": (lambda sd: {**sd, "step": 2 ** 64}, "step"),
    "meta-tensors": (lambda sd: _changed(sd, "2:output", fstate=torch.empty(5, dtype=torch.float64, device="meta")),
                     "holds no values"),
}


@pytest.mark.parametrize("case", list(CHECKPOINT_DEFECTS), ids=list(CHECKPOINT_DEFECTS))
def test_load_state_dict_refuses_a_state_that_breaks_an_invariant_naming_the_field(case):
    change, field = CHECKPOINT_DEFECTS[case]
    model, _ = loop()["make"]()
    with hookstats.attach(model) as mon:
        model(torch.ones(2, 5)).sum().backward()
        sd = mon.state_dict()
        before = mon.stats()
    with hookstats.attach(model) as other:
        other.load_state_dict(sd)  # the state dict as written loads
        assert other.stats().keys() == before.keys()
        with pytest.raises(ValueError) as e:
            other.load_state_dict(change(sd))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("load_state_dict: ") and (
        f"'{field}'" in msg if field.isidentifier() else field in msg), msg
