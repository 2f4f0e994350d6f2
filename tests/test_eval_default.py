"""Validation passes are recorded by default wherever records go: a monitor with a history or sinks measures
eval forwards unless eval=False; one without keeps to train steps unless eval=True. The eval figures equal the
test's own float64 hooks."""
import numpy as np
import pytest
import torch
from torch import nn

import hookstats
from hookstats.sinks import JSONLSink, read_jsonl


def train_and_validate(**kw):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3))
    seen = []
    model[0].register_forward_hook(lambda m, i, o: seen.append(o.detach().double().reshape(-1).numpy())
                                   if not model.training else None)
    mon = hookstats.attach(model, alerts=False, **kw)
    for _ in range(3):
        model(torch.randn(8, 5)).square().mean().backward()
    model.eval()
    with torch.no_grad():
        model(torch.randn(8, 5))
        model(torch.randn(8, 5) * 3)
    model.train()
    model(torch.randn(8, 5)).square().mean().backward()
    return mon, np.concatenate(seen) if seen else None


def test_a_monitor_with_a_history_records_validation_passes_by_default():
    mon, seen = train_and_validate(history=True)
    assert mon.track_eval
    frame = mon.history()
    rows = {st: v for p, t, st, v in zip(frame["phase"], frame["target"], frame["stat"], frame["value"])
            if p == "eval" and t == "0:output"}
    assert rows["count"] == seen.size
    # float32 values
    np.testing.assert_allclose([rows["mean"], rows["std"]], [seen.mean(), seen.std(ddof=1)], rtol=1e-6)
    mon.remove()


def test_a_monitor_with_sinks_only_records_validation_passes_by_default(tmp_path):
    mon, seen = train_and_validate(sinks=[JSONLSink(tmp_path / "h.jsonl")])
    mon.remove()
    evals = [r for _, r in read_jsonl(tmp_path / "h.jsonl")[0] if r["phase"] == "eval" and r["target"] == "0:output"]
    assert len(evals) == 1 and evals[0]["count"] == seen.size
    assert evals[0]["mean"] == pytest.approx(seen.mean(), rel=1e-6)


def test_eval_false_turns_it_off_and_a_monitor_without_records_keeps_to_train():
    mon, _ = train_and_validate(history=True, eval=False)
    assert not mon.track_eval and "eval" not in set(mon.history()["phase"])
    mon.remove()
    mon, _ = train_and_validate()
    assert not mon.track_eval and mon.stats(phase="eval") == {}
    mon.remove()
    mon, seen = train_and_validate(eval=True)
    assert mon.stats(phase="eval")["0:output"]["count"] == seen.size
    mon.remove()
