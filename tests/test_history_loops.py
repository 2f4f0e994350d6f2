"""History in realistic training loops: validation (eval-mode forwards), summary(), pause/resume, every=N,
manual steps with gradient accumulation, train-mode no_grad forwards, param_grads. Every train step must
reach the MemorySink and the CSV exactly once with that step's own values, and nothing of the eval
forwards; the oracle is the test's own hooks, filing each tensor under the step the loop says is running."""
import collections

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import hookstats
from hookstats.alerts import AlertWarning
from hookstats.sinks import CSVSink, MemorySink, read_csv

pytestmark = pytest.mark.filterwarnings("error::hookstats.history.HistoryWarning")


class Oracle:
    """Float64 copies of what the monitor should measure, by (step, target id). `step` is set by the loop:
    the running train step, None when nothing should be measured, "eval" for eval forwards."""

    def __init__(self, model, names, param_grads):
        self.step, self.params = None, param_grads
        self.seen = collections.defaultdict(list)
        self.total = collections.defaultdict(list)  # target -> train values since the last mon.reset()
        self.model = model
        for name in names:
            model.get_submodule(name).register_forward_hook(self._hook(name))

    def _hook(self, name):
        def hook(module, args, out):
            if self.step is None:
                return
            step = self.step
            if torch._C._current_graph_task_id() == -1:  # not a checkpointed forward recomputed in backward
                self.add(step, f"{name}:output", out)
            if out.requires_grad:
                out.register_hook(lambda g: self.add(step, f"{name}:grad_output", g))
        return hook

    def add(self, step, target, t):
        v = t.detach().double().numpy().ravel().copy()
        self.seen[(step, target)].append(v)
        if step != "eval":
            self.total[target].append(v)

    def param_grads(self):
        if self.step is None or not self.params:
            return
        for name, p in self.model.named_parameters():
            if p.grad is not None:
                self.add(self.step, f"{name}:param_grad", p.grad)


def model_and_data():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    g = torch.Generator().manual_seed(1)
    return model, lambda: torch.randn(4, 6, generator=g)


def run(actions, model, data, mon, oracle, every=1, manual=False):
    """Runs a loop described by `actions` and keeps the step number itself (the oracle's, not the monitor's).
    fwd/bwd: a train step's forward, then its backward and optimizer step (train = both); micro: a
    micro-batch (forward + backward) of a manual step, ended by "step" (optimizer step, mon.step());
    nograd: a train-mode forward without grad; ckpt: a forward checkpointed whole (use_reentrant=True); eval: a validation pass of 2 batches; summary: summary();
    pause/resume; reset: mon.reset()."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step, paused, loss = -1 if not manual else 0, False, None

    def sampled(k):
        return k if k % every == 0 and not paused else None

    for a in actions:
        if a in ("fwd", "train", "nograd", "ckpt") and not manual:
            step += 1
        if a in ("fwd", "train", "micro"):
            oracle.step = sampled(step)
            loss = model(data()).square().mean()
        elif a == "ckpt":  # the whole model checkpointed: a no-grad forward, recomputed in backward
            oracle.step = sampled(step)
            loss = checkpoint(model, data().requires_grad_(), use_reentrant=True).square().mean()
        if a in ("bwd", "train", "micro"):
            oracle.step = sampled(step)
            loss.backward()
        if a in ("bwd", "train"):
            oracle.param_grads()
            opt.step()
            opt.zero_grad()
        elif a == "step":
            oracle.step = sampled(step)
            oracle.param_grads()
            opt.step()
            opt.zero_grad()
            mon.step()
            step += 1
        elif a == "nograd":
            oracle.step = sampled(step)
            with torch.no_grad():
                model(data())
        elif a == "eval":
            oracle.step = "eval" if mon.track_eval and not paused else None
            model.eval()
            with torch.no_grad():
                for _ in range(2):
                    model(data())
            model.train()
        elif a == "summary":
            oracle.step = None
            hookstats.summary(model, data())
        elif a == "reset":
            mon.reset()
            oracle.total.clear()
        elif a in ("pause", "resume"):
            paused = a == "pause"
            getattr(mon, a)()
        oracle.step = None
    return step


def expected(oracle):
    """{(step, target): (count, mean, std)} of the train steps, from the oracle's tensors."""
    out = {}
    for (step, target), parts in oracle.seen.items():
        if step == "eval":
            continue
        v = np.concatenate(parts)
        out[(step, target)] = (v.size, v.mean(), v.std(ddof=1))
    return out


COUNTS = ("count", "finite", "near_zero_count", "nan", "posinf", "neginf", "underflow", "overflow", "hist", "log2_hist",
          "float_hist")


def check(items, want, what):
    items = [(step, rec) for step, rec in items if (rec.get("phase") or "train") == "train"]  # eval: its own phase
    got = collections.Counter((step, rec["target"]) for step, rec in items)
    assert sorted(got) == sorted(want), what
    assert max(got.values()) == 1, f"{what}: steps written twice: {[k for k, n in got.items() if n > 1]}"
    for step, rec in items:
        assert all(np.all(np.asarray(rec[k]) >= 0) for k in COUNTS if rec.get(k) is not None), (what, step, rec)
        count, mean, std = want[(step, rec["target"])]
        assert rec["count"] == count, (what, step, rec["target"])
        assert rec["mean"] == pytest.approx(mean, rel=1e-6, abs=1e-6 * std), (what, step, rec["target"])
        assert rec["std"] == pytest.approx(std, rel=1e-6), (what, step, rec["target"])


EPOCH = ["train"] * 3 + ["eval"]
LOOPS = {
    "validate_each_epoch": (EPOCH * 3, {}),
    "eval_after_every_step": (["train", "eval"] * 7, {}),
    "summary_between_and_inside_steps": (["train", "summary", "train", "fwd", "summary", "bwd", "train"], {}),
    "eval_true_keeps_eval_apart": (EPOCH * 3, {"eval": True}),
    "every_3_with_validation": (["train", "train", "eval"] * 5, {"every": 3}),
    "every_2_eval_after_every_step": (["train", "eval"] * 7, {"every": 2}),
    "train_mode_no_grad_forwards": (["train", "nograd", "eval", "train", "nograd", "nograd", "train"], {}),
    "pause_resume_around_validation": ((["train"] * 2 + ["pause", "eval", "resume"]) * 3 + ["train"], {}),
    "paused_train_steps": (["train", "pause", "train", "eval", "train", "resume", "train", "eval", "train"], {}),
    "param_grads_with_validation": (EPOCH * 3, {"param_grads": True}),
    "param_grads_every_2": (["train", "eval"] * 5, {"param_grads": True, "every": 2}),
    "checkpointed_root_with_summary_before_backward": (["ckpt", "summary", "bwd", "eval"] * 3, {}),
    "manual_accumulation_validate_inside": ((["micro", "eval", "micro", "eval", "step", "eval"] * 4),
                                            {"steps": "manual", "param_grads": True}),
    "manual_every_2_summary": ((["micro", "summary", "micro", "step"] * 5), {"steps": "manual", "every": 2}),
    # reset() restarts the running totals only: the open step's record keeps what it measured before
    "reset_after_each_step_like_the_callbacks": ((["train", "reset"] * 2 + ["train", "eval", "reset"]) * 2, {}),
    "reset_between_forward_and_backward": (["train", "fwd", "reset", "bwd", "train", "reset", "reset", "train"],
                                           {"param_grads": True}),
    "reset_between_micro_batches": (["micro", "reset", "micro", "step", "micro", "step", "reset", "micro", "micro",
                                     "reset", "step", "micro", "micro", "step"], {"steps": "manual", "param_grads": True}),
    "reset_with_every_2": ((["train", "reset", "train"] * 3), {"every": 2}),
}


@pytest.mark.parametrize("log_every", [1, 4])
@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_every_train_step_reaches_the_sinks_once_with_its_own_values(loop, log_every, tmp_path):
    actions, kwargs = LOOPS[loop]
    model, data = model_and_data()
    sink = MemorySink()
    mon = hookstats.attach(model, history=True, log_every=log_every, sinks=[sink, CSVSink(tmp_path / "h.csv")],
                           alerts=False, **kwargs)
    oracle = Oracle(model, ["0", "2"], kwargs.get("param_grads", False))
    run(actions, model, data, mon, oracle, every=kwargs.get("every", 1), manual=kwargs.get("steps") == "manual")
    mon.remove()  # records the open step
    want = expected(oracle)
    assert want  # the loop measured something
    check(list(sink.items()), want, "MemorySink")
    check(list(mon.history_sink.items()), want, "history()")
    check(read_csv(tmp_path / "h.csv")[0], want, "CSV")
    totals = mon.stats()  # the running totals: everything since the last reset()
    assert {t for t, r in totals.items() if r["count"]} == {t for t, parts in oracle.total.items() if parts}
    for target, parts in oracle.total.items():
        v = np.concatenate(parts)
        assert totals[target]["count"] == v.size and totals[target]["mean"] == pytest.approx(v.mean(), rel=1e-6)
    if kwargs.get("eval"):  # the eval forwards went to the eval phase, whole
        ev = np.concatenate(oracle.seen[("eval", "2:output")])
        got = mon.stats(phase="eval")["2:output"]
        assert got["count"] == ev.size and got["mean"] == pytest.approx(ev.mean(), rel=1e-6)


def test_alerts_fire_when_an_eval_forward_follows_every_step():
    model, data = model_and_data()
    mon = hookstats.attach(model, history=True, log_every=2)
    with pytest.warns(AlertWarning, match="NaN/Inf in 2:output at step 3"):
        for step in range(6):
            if step == 3:
                with torch.no_grad():
                    model[2].bias[0] = float("nan")
            model(data()).sum().backward()
            model.eval()
            with torch.no_grad():
                model(data())
            model.train()
        mon.flush()
    mon.remove()
    assert [(a["target"], a["step"]) for a in mon.alerts if a["kind"] == "nonfinite"][0] == ("2:output", 3)
