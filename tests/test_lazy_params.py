"""param_grads=True on a model with lazy parameters (LazyLinear before its first forward) is one clear error naming
the parameters and what to do; once a forward has materialized them, attach measures their gradients."""
import numpy as np
import pytest
import torch
from torch import nn

import hookstats


def test_param_grads_of_uninitialized_lazy_parameters_is_one_clear_error():
    model = nn.Sequential(nn.LazyLinear(4), nn.ReLU(), nn.Linear(4, 2))
    with pytest.raises(ValueError) as e:
        hookstats.attach(model, param_grads=True)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("param_grads=True: ") and "'0.weight'" in msg and "forward" in msg, msg


def test_after_one_forward_the_lazy_parameters_gradients_are_measured():
    model = nn.Sequential(nn.LazyLinear(4), nn.ReLU(), nn.Linear(4, 2))
    model(torch.zeros(1, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(5, 3)
    with hookstats.attach(model, param_grads=True) as mon:
        model(x).square().sum().backward()
        g = model[0].weight.grad.detach().double().numpy().copy()
        opt.step()
        got = mon.stats()["0.weight:param_grad"]
    np.testing.assert_allclose(got["mean"], g.mean(), rtol=1e-6, atol=1e-12)
    assert got["count"] == g.size
