"""One naming scheme for every dashboard name (hookstats/sinks/names.py): TensorBoardSink's tags, WandbSink's keys
and the HF/Lightning callbacks' metrics and histograms name a target alike, `hookstats/<module>/<kind><leaf>/<stat>`
(`/eval` before the statistic for a validation pass), checked against the rule written out here."""
import re

import pytest
import torch
from torch import nn

import hookstats
from hookstats.integrations.metrics import flat_metrics, measured
from hookstats.sinks import TensorBoardSink


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.enc = nn.Sequential(nn.Linear(4, 6))
        self.lstm = nn.LSTM(6, 5, batch_first=True)  # tuple output: leaves output[0], output[1][0], ...
        self.head = nn.Linear(5, 2)

    def forward(self, x):
        h, _ = self.lstm(self.enc(x))
        return self.head(h)


def expected(target, module, stat, phase="train", prefix="hookstats/"):
    """The documented rule: module, then kind and leaf, characters outside [A-Za-z0-9_.-/ ] as '_'."""
    rest = target[len(module) + 1:]
    name = prefix + re.sub(r"[^A-Za-z0-9_.\-/ ]", "_", f"{module}/{rest}")
    return f"{name}/eval/{stat}" if phase == "eval" else f"{name}/{stat}"


def test_sinks_and_callbacks_name_every_target_alike(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    model = Net()
    mon = hookstats.attach(model, eval=True, history=True, log_every=2, sinks=[TensorBoardSink(tmp_path)],
                           alerts=False)
    for _ in range(2):
        model(torch.randn(3, 7, 4)).sum().backward()
    model.eval()
    with torch.no_grad():
        model(torch.randn(3, 7, 4))
    stats = {"train": mon.stats(), "eval": mon.stats(phase="eval")}
    mon.remove()
    targets = {(phase, t, r["module"]) for phase, recs in stats.items() for t, r in recs.items() if r["count"]}
    assert any("[" in t for _, t, _ in targets)  # leaves with characters the rule replaces
    want = {expected(t, m, s, phase) for phase, t, m in targets for s in ("mean", "std")}
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    tb = {t for t in acc.Tags()["scalars"] if t.rsplit("/", 1)[1] in ("mean", "std")}
    assert tb == want
    # the callbacks' names (HF, Lightning: integrations/metrics.py), both phases
    cb = set()
    for phase, recs in stats.items():
        cb |= set(flat_metrics(recs, fields=("mean", "std")))
    assert cb == want
    # and their histograms: under the same base as the scalars
    bases = {b for phase, recs in stats.items() for b, _ in measured(recs)}
    assert {b + "/mean" for b in bases} == {w for w in want if w.endswith("/mean")}


def test_the_root_module_and_a_prefix_follow_the_rule():
    from hookstats.sinks.names import record_name, stat_name, target_name
    assert stat_name(target_name("Net:output", "Net"), "mean") == "hookstats/Net/output/mean"
    assert target_name("a.b:grad_input[1]@2", "a.b", "eval", "mon/") == "mon/a.b/grad_input_1__2/eval"
    assert record_name({"target": "fc:output", "module": "fc", "phase": "eval"}) == "hookstats/fc/output/eval"
    with pytest.raises(ValueError, match="phase must be 'train' or 'eval'"):
        target_name("fc:output", "fc", "test")
