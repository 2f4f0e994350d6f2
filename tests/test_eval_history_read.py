"""A validation pass that ran after its step's end (steps="manual": after mon.step(); a compiled model: after the
optimizer step) is in mon.history() as soon as the history is read, as concepts.md says, not one read late; a read
in the middle of a pass loses nothing and writes no (step, target) twice. Counts and moments against the test's
own float64 hooks."""
import collections

import numpy as np
import torch
from torch import nn

import hookstats
from hookstats.sinks import MemorySink


def run(actions):
    """actions: "train" (a step: forward, backward, optimizer step, mon.step()), "val" (an eval forward under
    no_grad), "read" (mon.history()). Returns the monitor, its MemorySink, the eval rows each read saw
    ({read index: {(step, target): count}}) and the oracle's eval values per pass (the eval forwards after the
    last read or train step: [(float64 values of "0:output")])."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 2))
    passes, current = [], []
    model[0].register_forward_hook(lambda m, a, out: None if model.training else current.append(
        out.detach().double().reshape(-1).numpy()))
    memory = MemorySink()
    mon = hookstats.attach(model, steps="manual", eval=True, sinks=[memory], log_every=100, alerts=False, grads=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    reads = []
    for a in actions:
        if a == "train":
            model.train()
            model(torch.randn(4, 5)).square().mean().backward()
            opt.step()
            opt.zero_grad()
            mon.step()
        elif a == "val":
            model.eval()
            with torch.no_grad():
                model(torch.randn(3, 5))
        elif a == "read":
            if current:
                passes.append(np.concatenate(current))
                current = []
            h = mon.history()
            rows = (h["phase"] == "eval") & (h["target"] == "0:output") & (h["stat"] == "count")
            reads.append(dict(zip(h[rows]["step"].astype(int), h[rows]["value"])))
    return mon, memory, reads, passes, current


def test_a_validation_pass_after_mon_step_is_in_the_history_read_right_after_it():
    mon, memory, reads, passes, _ = run(["train", "train", "val", "val", "read", "train", "val", "read"])
    mon.remove()
    assert reads[0] == {2: passes[0].size}  # the pass ran in step 2, opened by the second mon.step()
    assert reads[1] == {2: passes[0].size, 3: passes[1].size}
    evals = [(s, r) for s, r in memory.items() if r["phase"] == "eval" and r["target"] == "0:output"]
    assert [s for s, _ in evals] == [2, 3]
    for (_, rec), v in zip(evals, passes):
        assert rec["count"] == v.size
        np.testing.assert_allclose([rec["mean"], rec["std"]], [v.mean(), v.std(ddof=1)], rtol=1e-6)


def test_a_read_in_the_middle_of_a_pass_loses_nothing_and_writes_no_record_twice():
    mon, memory, reads, passes, rest = run(["train", "val", "read", "val", "train", "train", "val", "read"])
    before = mon.stats(phase="eval")["0:output"]["count"]
    mon.remove()
    evals = [(s, r) for s, r in memory.items() if r["phase"] == "eval"]
    twice = [k for k, n in collections.Counter((s, r["target"]) for s, r in evals).items() if n > 1]
    assert not twice
    counts = [r["count"] for s, r in evals if r["target"] == "0:output"]
    assert reads[0] == {1: passes[0].size}
    assert sum(counts) == before == sum(v.size for v in passes) + sum(v.size for v in rest)


def test_eval_forwards_after_a_read_and_before_remove_are_written_with_the_next_step():
    mon, memory, reads, passes, rest = run(["train", "val", "read", "val"])
    mon.remove()
    evals = [(s, r["count"]) for s, r in memory.items() if r["phase"] == "eval" and r["target"] == "0:output"]
    assert evals == [(1, passes[0].size), (2, rest[0].size)]


def test_a_read_before_a_rollback_leaves_the_reloaded_steps_pass_in_its_own_step():
    """A validation pass read early (in the open step), then load_state_dict() of an earlier checkpoint: the rerun's
    pass of that step is in the read right after it and stays in that step (it was left out, then recorded with the
    next step)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 3))
    opt = torch.optim.SGD(m.parameters(), 0.1)

    def train():
        m.train()
        m(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()

    def validate(n):
        m.eval()
        with torch.no_grad():
            m(torch.randn(n, 4))
        m.train()

    def eval_counts(h):
        c = h[(h["stat"] == "count") & (h["phase"] == "eval")]
        return c[["step", "value"]].values.tolist()
    mon = hookstats.attach(m, steps="manual", eval=True, history=True, alerts=False)
    train()
    mon.step()
    sd = mon.state_dict()
    train()
    mon.step()
    validate(5)
    mon.history()
    mon.load_state_dict(sd)
    train()
    mon.step()
    validate(7)
    assert eval_counts(mon.history()) == [[2, 21]]
    for _ in range(2):
        train()
        mon.step()
    assert eval_counts(mon.history()) == [[2, 21]]
    mon.remove()
