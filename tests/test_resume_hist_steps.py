"""stats()' hist_steps after a resume: a checkpoint's running histograms keep naming the steps they hold, so a
resumed monitor's hist_steps agree with its hist_count (the values its histograms hold, counted by the test)."""
import io

import pytest
import torch
from torch import nn

import hookstats

PER_STEP = 4 * 16  # values of "0:output" per step: a batch of 4, 16 features


def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))


def train(model, opt, steps, mon=None):
    for _ in steps:
        model(torch.randn(4, 6)).square().mean().backward()
        opt.step()
        opt.zero_grad()
        if mon is not None:
            mon.step()


def hist_steps_by_the_docs(steps, hist_every):
    """concepts.md: step 0, every hist_every-th step after it, and the ramp 1, 2, 4, ... before the second (every=1)."""
    return [k for k in steps if k % hist_every == 0 or (k < hist_every and k & (k - 1) == 0)]


@pytest.mark.parametrize("manual", [False, True], ids=["forward_steps", "manual_steps"])
def test_a_resumed_monitor_names_the_checkpoints_histogram_steps(manual):
    kw = dict(hist_every=4, steps="manual" if manual else "forward")
    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = hookstats.attach(model, **kw)
    train(model, opt, range(6), mon if manual else None)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "mon": mon.state_dict()}, buf)
    mon.remove()

    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)
    model = make()
    model.load_state_dict(ckpt["model"])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = hookstats.attach(model, **kw)
    mon.load_state_dict(ckpt["mon"])
    train(model, opt, range(6, 10), mon if manual else None)
    rec = mon.stats()["0:output"]
    mon.remove()

    want = hist_steps_by_the_docs(range(10), 4)  # [0, 1, 2, 4, 8]
    assert rec["count"] == 10 * PER_STEP
    assert rec["hist_count"] == len(want) * PER_STEP
    got = rec["hist_steps"]
    assert [k for r in got["steps"] for k in r] == want
    assert (got["count"], got["first"], got["last"]) == (len(want), want[0], want[-1])


@pytest.mark.parametrize("bad", [[[4, 2, 1]], [[0, 3, 0]], [[2, 3, 1], [0, 1, 1]], "0..4", [[0, 1.5, 1]]])
def test_a_state_dict_with_bad_hist_steps_is_one_clear_error_that_changes_nothing(bad):
    model = make()
    mon = hookstats.attach(model)
    train(model, torch.optim.SGD(model.parameters(), lr=0.01), range(3))
    sd = mon.state_dict()
    before = mon.stats()["0:output"]
    with pytest.raises(ValueError, match="hist_steps"):
        mon.load_state_dict({**sd, "hist_steps": bad})
    assert mon.stats()["0:output"]["hist_steps"] == before["hist_steps"]
    mon.remove()
