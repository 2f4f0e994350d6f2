"""mon.grad_norms(group=...) on 2 gloo processes, each holding the gradients of half the model's parameters (the
other half frozen on it): the group's norms against torch's clip_grad_norm_ on the whole model in one process and
the test's float64 norm of each gradient; without group, each rank's norms are its own half's."""
import numpy as np
import pytest
import torch
from torch import nn

import hookstats
import spawn_ranks

STEPS, CLIP = 4, 0.35
pytestmark = pytest.mark.slow  # spawned process groups (tens of seconds): .ci/run runs them


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 12), nn.Tanh(), nn.Linear(12, 12), nn.Tanh(), nn.Linear(12, 3))


def batch(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(16, 8, generator=g) * (1 + step)  # growing gradients: some steps clip, some do not


def halves(m):
    """Rank 0's parameters (the first layer and the second's weight) and rank 1's (the rest)."""
    named = list(m.named_parameters())
    return [n for n, _ in named[:3]], [n for n, _ in named[3:]]


def worker(rank, world):
    m = model()
    mine = halves(m)[rank]
    for n, p in m.named_parameters():
        p.requires_grad_(n in mine)
    mon = hookstats.attach(m, param_grads=True, history=True, steps="manual", log_every=2)
    for step in range(STEPS):
        m(batch(step)).square().mean().backward()
        mon.step()
        m.zero_grad(set_to_none=True)
    summed, own = mon.grad_norms(CLIP, group="all"), mon.grad_norms(CLIP)
    mon.remove()
    return {"summed": summed, "own": own}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return spawn_ranks.run(worker, 2, tmp_path_factory.mktemp("grad_norms"))


def whole_model():
    """Per step: torch's total norm of the whole model's gradients, {name: float64 norm}."""
    m = model()
    out = []
    for step in range(STEPS):
        m(batch(step)).square().mean().backward()
        total = torch.nn.utils.clip_grad_norm_(m.parameters(), max_norm=float("inf")).item()
        out.append((total, {n: float(np.linalg.norm(p.grad.double().numpy().ravel())) for n, p in m.named_parameters()}))
        m.zero_grad(set_to_none=True)
    return out


def test_the_group_s_norms_are_the_whole_model_s(ranks):
    want = whole_model()
    total = np.array([w[0] for w in want])
    for r in ranks:
        n = r["summed"]
        assert n.steps == list(range(STEPS))
        assert sorted(t.split(":")[0] for t in n.targets) == sorted(want[0][1])
        np.testing.assert_allclose(n.total, total, rtol=1e-5)
        for p, t in enumerate(n.targets):
            name = t.split(":")[0]
            np.testing.assert_allclose(n.norms[:, p], [w[1][name] for w in want], rtol=1e-5)
            np.testing.assert_allclose(n.share[:, p], [w[1][name] ** 2 for w in want] / total ** 2, rtol=1e-5)
        np.testing.assert_allclose(n.clip_coef, np.minimum(1.0, CLIP / (total + 1e-6)), rtol=1e-5)
        np.testing.assert_array_equal(n.clipped, total > CLIP)
    assert ranks[0]["summed"].clipped.any() and not ranks[0]["summed"].clipped.all()  # the test sees both cases
    np.testing.assert_array_equal(ranks[0]["summed"].norms, ranks[1]["summed"].norms)  # every rank gets the same


def test_without_group_each_rank_s_norms_are_its_own_half(ranks):
    want = whole_model()
    for r, names in zip(ranks, halves(model())):
        own = r["own"]
        assert sorted(t.split(":")[0] for t in own.targets) == sorted(names)
        half = np.sqrt([sum(w[1][n] ** 2 for n in names) for w in want])
        np.testing.assert_allclose(own.total, half, rtol=1e-5)
