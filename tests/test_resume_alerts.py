"""A monitor rewound in its own process (load_state_dict of an earlier checkpoint after running further) keeps no
alert of the superseded steps in mon.alerts, and the run that goes on raises its own. The test knows where it put
the NaN: that is the oracle."""
import math
import warnings

import pytest
import torch
from torch import nn

import hookstats
from hookstats.alerts import AlertWarning

CKPT_AT, END = 14, 24  # the checkpoint holds steps 0..14; both runs go on to step 24


def _train(model, opt, steps, nan_at):
    for s in steps:
        x = torch.randn(7, 5, generator=torch.Generator().manual_seed(s))
        if s == nan_at:
            x[0, 0] = math.nan
        model(x).square().mean().backward()
        if s != nan_at:  # the weights stay as they were: the NaN is in this step's values only
            opt.step()
        opt.zero_grad()


def _rewound(second_nan_at):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AlertWarning)
        mon = hookstats.attach(model, history=True, log_every=4)
        _train(model, opt, range(CKPT_AT + 1), None)
        ckpt = mon.state_dict()
        _train(model, opt, range(CKPT_AT + 1, END + 1), 20)
        mon.flush()
        first = [(a["step"], a["kind"]) for a in mon.alerts]
        mon.load_state_dict(ckpt)
        after_load = list(mon.alerts)
        _train(model, opt, range(CKPT_AT + 1, END + 1), second_nan_at)
        mon.flush()
        alerts = list(mon.alerts)
        mon.remove()
    return first, after_load, alerts


def test_alerts_of_superseded_steps_are_dropped_on_a_rewind():
    first, after_load, alerts = _rewound(None)
    assert first and {s for s, _ in first} == {20} and {k for _, k in first} == {"nonfinite"}  # the setup fired
    assert after_load == [] and alerts == []


def test_the_run_that_goes_on_raises_its_own_alerts_again():
    first, _, alerts = _rewound(22)
    assert {s for s, _ in first} == {20}
    assert alerts and {a["step"] for a in alerts} == {22}
    assert len({(a["target"], a["kind"]) for a in alerts}) == len(alerts)  # each once
