"""Validation passes after a resume: each pass's record in the history holds that pass alone, not the checkpoint's
eval totals with it. Against the test's own float64 hooks on the first layer's output."""
import io

import numpy as np
import pytest
import torch
from torch import nn

import hookstats
from hookstats.sinks import MemorySink


def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


def run(model, mon, steps, manual, passes):
    """Train steps, each followed by a validation pass of two forwards; passes gets each pass's float64 values."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in steps:
        model.train()
        model(torch.randn(3, 4)).square().mean().backward()
        opt.step()
        opt.zero_grad()
        if manual:
            mon.step()
        model.eval()
        seen = []
        handle = model[0].register_forward_hook(lambda m, a, out: seen.append(out.double().reshape(-1).numpy()))
        with torch.no_grad():
            for _ in range(2):
                model(torch.randn(5, 4))
        handle.remove()
        passes.append(np.concatenate(seen))


@pytest.mark.parametrize("manual", [False, True], ids=["forward_steps", "manual_steps"])
def test_each_validation_pass_after_a_resume_is_its_own_record(manual):
    kw = dict(eval=True, grads=False, alerts=False, steps="manual" if manual else "forward")
    model, first = make(), []
    mon = hookstats.attach(model, **kw)
    run(model, mon, range(3), manual, first)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "mon": mon.state_dict()}, buf)
    mon.remove()

    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)
    model, later, memory = make(), [], MemorySink()
    model.load_state_dict(ckpt["model"])
    mon = hookstats.attach(model, sinks=[memory], **kw)
    mon.load_state_dict(ckpt["mon"])
    run(model, mon, range(3, 5), manual, later)
    total = mon.stats(phase="eval")["0:output"]["count"]
    mon.remove()
    recs = [r for s, r in memory.items() if r["phase"] == "eval" and r["target"] == "0:output"]
    assert len(recs) == len(later)
    for rec, v in zip(recs, later):
        assert rec["count"] == v.size
        np.testing.assert_allclose([rec["mean"], rec["std"]], [v.mean(), v.std(ddof=1)], rtol=1e-6)
    assert total == sum(v.size for v in first + later)
