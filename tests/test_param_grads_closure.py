"""param_grads=True when the optimizer is given a closure (LBFGS, Lightning's automatic optimization): the
forward and backward run inside step(), after torch's step pre-hooks, so each step's gradients are measured
after the step, as the optimizer stepped with them (clipped inside the closure), in their own step, in silence."""
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import hookstats


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))


def closure_loop(model, opt, steps, clip):
    """Trains with opt.step(closure); the float64 gradients each step stepped with."""
    stepped = []
    for i in range(steps):
        x = torch.randn(5, 6, generator=torch.Generator().manual_seed(i))

        def closure():
            opt.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            if clip:
                nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
            return loss
        opt.step(closure)
        stepped.append({n: p.grad.detach().double().clone() for n, p in model.named_parameters()})
    return stepped


def test_each_step_measures_the_gradients_its_closure_made_clipped_and_silent():
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mon = hookstats.attach(model, param_grads=True, history=True, log_every=1)
        stepped = closure_loop(model, opt, 3, clip=True)
        mon.remove()
    h = mon.history()
    for name in ("0.weight", "2.bias"):
        rows = h[(h["target"] == f"{name}:param_grad") & (h["stat"] == "l2")].sort_values("step")
        np.testing.assert_allclose(rows["value"].to_numpy(), [g[name].norm().item() for g in stepped], rtol=1e-6)
        rows = h[(h["target"] == f"{name}:param_grad") & (h["stat"] == "count")].sort_values("step")
        assert rows["value"].tolist() == [stepped[0][name].numel()] * 3
    total = mon.stats(kind="param_grad")["0.weight:param_grad"]
    assert np.isclose(total["mean"], np.mean([g["0.weight"].mean().item() for g in stepped]), rtol=1e-6)


def test_lbfgs_measures_its_last_closure_once_per_step():
    model = net()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=3)
    mon = hookstats.attach(model, param_grads=True, history=True, log_every=1)
    stepped = closure_loop(model, opt, 2, clip=False)
    mon.remove()
    h = mon.history()
    rows = h[(h["target"] == "2.weight:param_grad") & (h["stat"] == "count")]
    assert rows["value"].sum() == 2 * stepped[0]["2.weight"].numel()


STEPS = 4


@pytest.mark.parametrize("steps", ["forward", "manual"])
def test_a_closure_steps_gradients_are_measured_in_their_own_step(steps):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = hookstats.attach(model, param_grads=True, history=True, log_every=2, steps=steps, alerts=False)
    seen = []
    for k in range(STEPS):
        x = torch.randn(4, 6)

        def closure():
            opt.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            seen.append(model[0].weight.grad.detach().double().flatten().numpy().copy())
            return loss

        opt.step(closure)
        if steps == "manual":
            mon.step()
    total = mon.stats()["0.weight:param_grad"]
    hist = mon.history()
    mon.remove()
    rows = hist[(hist["target"] == "0.weight:param_grad") & (hist["stat"] == "mean")]
    assert list(rows["step"]) == list(range(STEPS))
    # float32 sums: a mean near 0 is compared at the scale of the values
    np.testing.assert_allclose(list(rows["value"]), [v.mean() for v in seen], rtol=1e-6, atol=1e-6 * np.abs(seen).max())
    v = np.concatenate(seen)
    assert total["count"] == v.size
    np.testing.assert_allclose([total["mean"], total["std"]], [v.mean(), v.std(ddof=1)], rtol=1e-6)


def test_lbfgs_closure_evaluations_are_one_step_with_steps_counted_per_forward():
    """LBFGS evaluates its closure several times in one step(): those forwards are one step (they were a step each,
    so every=2 sampled a varying share of optimizer steps). Each step's record holds all its evaluations' outputs,
    and every=2 measures the gradients of optimizer steps 0 and 2, as the test's own hooks saw them."""
    model = net()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=4)
    mon = hookstats.attach(model, param_grads=True, every=2, history=True, log_every=1, alerts=False)
    calls, outputs = [], []
    model[0].register_forward_hook(lambda mod, args, out: outputs.append(out.numel()))
    for i in range(3):
        x = torch.randn(5, 6, generator=torch.Generator().manual_seed(i))
        calls.append(0)

        def closure():
            calls[-1] += 1
            opt.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            return loss
        opt.step(closure)
    assert max(calls) > 1  # LBFGS did evaluate several times in a step
    mon.step()
    h = mon.history()
    total = mon.stats(kind="param_grad")["0.weight:param_grad"]
    mon.remove()
    rows = h[(h["target"] == "0:output") & (h["stat"] == "count")].sort_values("step")
    assert rows["step"].tolist() == [0, 2]  # every=2: optimizer steps 0 and 2
    per_step = [sum(outputs[sum(calls[:k]):sum(calls[:k + 1])]) for k in range(3)]
    assert rows["value"].tolist() == [per_step[0], per_step[2]]
    assert total["count"] == 2 * model[0].weight.numel()
