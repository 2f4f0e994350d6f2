"""Alerts: NaN/Inf (first target in forward order and step), dead units, exploding/vanishing std, each
raised once, as a warning and through the sinks; the expected steps come from NumPy over the same data."""
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import hookstats
from hookstats.alerts import AlertRules, AlertWarning
from hookstats.sinks import MemorySink


def chain(width=6, depth=3):
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(width, width) for _ in range(depth)])


def train(model, mon, steps, before_step=None, scale=lambda s: 1.0):
    torch.manual_seed(1)
    for s in range(steps):
        if before_step:
            before_step(s)
        with torch.no_grad():
            model(torch.randn(8, 6) * scale(s))
        mon.step()


def nonfinite_run(model, weight, at, steps, first, **attach):
    """Trains with a NaN put into `weight` before step `at`: the NaN alerts (the first one checked to be
    named `first`, as the warning and as the only one marked first)."""
    mon = hookstats.attach(model, steps="manual", history=True, log_every=4, **attach)

    def poison(s):
        if s == at:
            with torch.no_grad():
                weight[0, 0] = float("nan")

    with pytest.warns(AlertWarning, match=rf"NaN/Inf in {first} at step {at} \(the first target in forward order"):
        train(model, mon, steps, before_step=poison)
    mon.remove()
    nonfinite = [a for a in mon.alerts if a["kind"] == "nonfinite"]
    assert nonfinite[0].get("first") and not any(a.get("first") for a in nonfinite[1:])
    return nonfinite


def test_nonfinite_names_the_first_target_in_forward_order_and_the_step():
    model = chain()
    sink = MemorySink()
    nonfinite = nonfinite_run(model, model[1].weight, 5, 9, "1:output", sinks=[sink])
    assert [(a["target"], a["step"]) for a in nonfinite] == [("1:output", 5), ("2:output", 5)]
    assert [a["target"] for a in sink.alerts if a["kind"] == "nonfinite"] == ["1:output", "2:output"]


class HeadFirst(nn.Module):
    """Registers `head` before `body` but runs `body` first: forward order is not registration order."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.head = nn.Linear(6, 6)
        self.body = nn.Linear(6, 6)

    def forward(self, x):
        return self.head(self.body(x))


def test_nonfinite_first_target_follows_the_forward_not_the_registration_order():
    model = HeadFirst()
    nonfinite = nonfinite_run(model, model.body.weight, 2, 5, "body:output")
    assert [(a["target"], a["step"]) for a in nonfinite] == [("body:output", 2), ("head:output", 2)]


def test_dead_target_after_k_steps_and_never_for_a_healthy_one():
    model = chain()
    with torch.no_grad():
        model[2].weight.zero_()
        model[2].bias.zero_()
    rules = AlertRules(dead_fraction=0.9, dead_steps=4)
    mon = hookstats.attach(model, steps="manual", history=True, log_every=3, alerts=rules)
    with pytest.warns(AlertWarning, match="2:output looks dead"):
        train(model, mon, 8)
    mon.remove()
    dead = [(a["target"], a["step"]) for a in mon.alerts if a["kind"] == "dead"]
    assert dead == [("2:output", 3)]  # steps 0..3 all zero: the 4th step in a row is step 3


@pytest.mark.parametrize("factor, kind", [(1e3, "exploding_std"), (1e-3, "vanishing_std")])
def test_std_jump_against_the_targets_own_running_average(factor, kind):
    model = nn.Linear(6, 6, bias=False)
    torch.manual_seed(0)
    rules = AlertRules(warmup=5, std_factor=10.0, ema=0.2)
    mon = hookstats.attach(model, steps="manual", history=True, log_every=5, alerts=rules)
    outs = []
    torch.manual_seed(1)
    with pytest.warns(AlertWarning, match=kind.split("_")[0]):
        for s in range(16):
            x = torch.randn(8, 6) * (factor if s == 12 else 1.0)
            with torch.no_grad():
                outs.append(model(x).double().numpy())
            mon.step()
        mon.remove()
    # NumPy oracle of the rule: EMA of past calm step stds, alert where std leaves [ema/10, 10*ema]
    ema, n, first = 0.0, 0, None
    for s, o in enumerate(outs):
        std = o.std(ddof=1)
        flagged = n >= 5 and (std > 10 * ema or std * 10 < ema)
        if flagged and first is None:
            first = (s, std, ema)
        if not flagged:
            ema = std if n == 0 else ema + 0.2 * (std - ema)
            n += 1
    got = [a for a in mon.alerts if a["kind"] == kind]
    assert len(got) == 1 and got[0]["step"] == first[0] == 12
    assert got[0]["std"] == pytest.approx(first[1], rel=1e-5)
    assert got[0]["reference"] == pytest.approx(first[2], rel=1e-5)
    assert [a["kind"] for a in mon.alerts] == [kind]


def test_alerts_off_and_bad_rules():
    model = chain()
    mon = hookstats.attach(model, steps="manual", history=True, alerts=False)
    with torch.no_grad():
        model[0].bias[0] = float("inf")
    train(model, mon, 3)
    mon.remove()
    assert mon.alerts == []
    for kwargs, match in (({"dead_fraction": 2}, "dead_fraction"), ({"dead_steps": 0}, "dead_steps"),
                          ({"std_factor": 1}, "std_factor"), ({"ema": 0}, "ema"), ({"warmup": 1.5}, "warmup")):
        with pytest.raises(ValueError, match=match):
            AlertRules(**kwargs)


def test_alert_state_is_on_the_device_and_one_row_per_target():
    model = chain()
    mon = hookstats.attach(model, steps="manual", history=True, log_every=100)
    train(model, mon, 3)
    ring = next(iter(mon.step_history.rings.values()))
    row = ring.alert_row
    assert row.device == next(model.parameters()).device
    assert row.shape[0] == len(ring.keys)
    assert np.all(row[:, 0].numpy() == -1)  # no NaN/Inf seen
    mon.remove()


def _poisoned():
    model = chain()
    with torch.no_grad():
        model[1].weight[0, 0] = float("nan")
    return model


@pytest.mark.parametrize("where", ["forward", "step", "flush", "remove", "history"])
def test_warnings_point_at_the_users_line_not_at_hookstats(where):
    # the warnings surface from a root forward (the step end flushes), mon.step(), flush(), remove() or
    # history(): each at a different depth inside hookstats and torch
    model = _poisoned()
    manual = where in ("step", "flush", "remove", "history")
    mon = hookstats.attach(model, steps="manual" if manual else "forward", history=True,
                           log_every=1 if where in ("forward", "step") else 1000)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            model(torch.randn(8, 6)).sum().backward()
            if manual:
                mon.step()
        if where == "flush":
            mon.flush()
        elif where == "remove":
            mon.remove()
        elif where == "history":
            mon.history()
        mon.remove()
    alerts = [w for w in caught if issubclass(w.category, AlertWarning)]
    assert alerts, where
    assert {w.filename for w in alerts} == {__file__}, [(w.filename, w.lineno) for w in alerts]



@pytest.mark.parametrize("kwargs, match", [
    ({"dead_fraction": "0.5"}, "dead_fraction must be a number, got str"),
    ({"dead_fraction": np.float64(1.5)}, r"dead_fraction must be in \[0, 1\], got 1.5"),
    ({"dead_steps": np.int64(0)}, "dead_steps must be an int >= 1, got 0"),
    ({"warmup": True}, "warmup must be an int, got bool"),
    ({"std_factor": None}, "std_factor must be a number, got NoneType"),
    ({"std_factor": np.float32(1)}, "std_factor must be > 1, got 1"),
    ({"ema": np.float64(0)}, r"ema must be in \(0, 1\], got 0"),
    ({"enabled": "yes"}, "enabled must be True or False, got str"),
    ({"nonfinite": 1}, "nonfinite must be True or False, got int"),
])
def test_bad_rules_get_one_value_error_naming_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AlertRules(**kwargs)


def test_numpy_scalars_make_the_same_rules():
    np_rules = AlertRules(enabled=np.bool_(True), dead_fraction=np.float32(0.5), dead_steps=np.int64(3),
                          std_factor=np.int64(4), warmup=np.int32(2), ema=np.float64(0.25))
    assert np_rules == AlertRules(dead_fraction=0.5, dead_steps=3, std_factor=4.0, warmup=2, ema=0.25)
    assert all(type(getattr(np_rules, f)) in (bool, int, float) for f in ("enabled", "dead_fraction", "dead_steps",
                                                                         "std_factor", "warmup", "ema"))
