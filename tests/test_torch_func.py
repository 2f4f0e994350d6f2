"""torch.func on a monitored model: per-sample gradients (vmap(grad(functional_call))), the recipe of Opacus-style
training, hand the hooks batched tensors, which have no data of their own. Each target is measured over every
sample, as a batched forward and backward give them, on the compiled op and the reference, against the test's own
hooks on a twin model run as one batch (tests/zoo_oracle.py)."""
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

import hookstats
from zoo_oracle import Oracle, assert_moments_agree


def net():
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def test_per_sample_gradients_measure_every_sample_as_one_batch(backend):
    torch.manual_seed(0)
    model, ref = net(), net()
    ref.load_state_dict(model.state_dict())
    xs = [torch.randn(6, 8) for _ in range(2)]

    oracle = Oracle(ref, {"0": ref[0], "2": ref[2]}, inputs=True)
    for k, x in enumerate(xs):
        oracle.step = k
        loss = ref(x).square().sum()  # the sum of the per-sample losses: the same gradient into each output
        oracle.backward = True
        loss.backward()
        oracle.backward = False

    mon = hookstats.attach(model, inputs=True)
    params = {n: p.detach() for n, p in model.named_parameters()}

    def loss(p, x):
        return functional_call(model, p, (x,)).square().sum()

    for x in xs:
        per_sample = vmap(grad(loss), in_dims=(None, 0))(params, x)
        assert per_sample["0.weight"].shape == (6, 16, 8)
    got = mon.stats()
    want = {f"{m}:{k}" for m in ("0", "2") for k in ("output", "grad_output", "input")}
    assert oracle.targets("train") == want
    assert set(got) == want
    assert_moments_agree(oracle, got, want, mon.cfg)
    mon.remove()
