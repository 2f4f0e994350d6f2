"""Parameter gradients of an optimizer stepped with a closure (opt.step(closure): LBFGS, Lightning's automatic
optimization), whose forward and backward run inside step(), after its pre-step hook: each step's gradients are
measured in that step, the last step's too. Against the gradients the closure reads itself."""
import numpy as np
import pytest
import torch
from torch import nn

import hookstats

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
