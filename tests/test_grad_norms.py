"""The gradient norm by parameter (param_grads=True), derived on the host from the history: against
torch.nn.utils.clip_grad_norm_'s own total norm and what it does to copies of the gradients, and against the
test's float64 norms of each p.grad; given to the sinks at each flush; no host sync in a step; under torch.compile."""
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import hookstats
from hookstats.sinks import Sink

from helpers import no_host_sync

CLIP = 0.4


class GradNormSink(Sink):
    def __init__(self):
        super().__init__()
        self.got = []

    def write(self, step, records):
        pass

    def write_grad_norms(self, norms):
        self.got.append(norms)


def train(steps=8, compiled=False, sinks=(), clip_norm=None):
    """(monitor, per step: torch's total norm, {param name: float64 norm}, {param name: norm after torch clips a
    copy to CLIP})."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    mon = hookstats.attach(model, param_grads=True, history=True, log_every=3, sinks=list(sinks),
                           clip_norm=clip_norm)
    fwd = torch.compile(model) if compiled else model
    want = []
    for s in range(steps):
        x = torch.randn(32, 10) * (1 + s)  # growing gradients: some steps clip, some do not
        loss = fwd(x).square().mean()
        opt.zero_grad()
        loss.backward()
        named = [(n, p) for n, p in model.named_parameters()]
        total = torch.nn.utils.clip_grad_norm_([p for _, p in named], max_norm=float("inf")).item()
        own = {n: float(np.linalg.norm(p.grad.double().numpy().ravel())) for n, p in named}
        copies = holders([p.grad.clone() for _, p in named])
        torch.nn.utils.clip_grad_norm_(copies, max_norm=CLIP)
        after = {n: float(np.linalg.norm(c.grad.double().numpy().ravel())) for (n, _), c in zip(named, copies)}
        want.append((total, own, after))
        opt.step()
    mon.flush()
    return mon, want


def holders(grads):
    """Parameters outside the model whose .grad are these tensors (clip_grad_norm_ scales .grad in place)."""
    out = []
    for g in grads:
        p = nn.Parameter(torch.zeros_like(g))
        p.grad = g
        out.append(p)
    return out


def check(norms, want, steps=None):
    steps = steps or list(range(len(want)))
    assert norms.steps == steps
    total, own, after = (np.array([want[s][0] for s in steps]), [want[s][1] for s in steps],
                         [want[s][2] for s in steps])
    np.testing.assert_allclose(norms.total, total, rtol=1e-5)
    for p, t in enumerate(norms.targets):
        name = t.split(":")[0]
        np.testing.assert_allclose(norms.norms[:, p], [o[name] for o in own], rtol=1e-5)
        shares = np.array([o[name] ** 2 for o in own]) / total ** 2
        np.testing.assert_allclose(norms.share[:, p], shares, rtol=1e-5)
        if norms.clip_norm is not None:
            np.testing.assert_allclose(norms.norms_after[:, p], [a[name] for a in after], rtol=1e-5)
    if norms.clip_norm is not None:
        np.testing.assert_array_equal(norms.clipped, total > CLIP)


def test_the_norms_match_torch_clip_grad_norm_and_float64_norms_of_each_gradient():
    mon, want = train(clip_norm=CLIP)
    norms = mon.grad_norms(clip_norm=CLIP)
    assert len(norms.targets) == 6
    assert norms.clipped.any() and not norms.clipped.all()  # the test sees both cases
    check(norms, want)
    np.testing.assert_allclose(norms.share.sum(axis=1), 1.0, rtol=1e-12)
    mon.remove()


def test_the_sinks_get_each_flush_s_norms_with_the_attached_clip_norm():
    sink = GradNormSink()
    mon, want = train(steps=7, sinks=[sink], clip_norm=CLIP)
    mon.remove()
    # the ramp's histogram steps 1 and 2 (hist_every=3) find the one float-bucket row full: the steps before each
    # go early, with their norms
    assert [n.steps for n in sink.got] == [[0], [1], [2], [3, 4, 5], [6]]
    for n in sink.got:
        assert n.clip_norm == CLIP
        check(n, want, n.steps)


def test_a_nan_gradient_makes_its_norm_and_the_total_nan_as_in_torch():
    from hookstats.grad_norms import grad_norms
    items = [(0, {"target": "a:param_grad", "kind": "param_grad", "l2": 3.0, "nan": 0}),
             (0, {"target": "b:param_grad", "kind": "param_grad", "l2": 4.0, "nan": 0}),
             (1, {"target": "a:param_grad", "kind": "param_grad", "l2": 3.0, "nan": 1}),
             (1, {"target": "b:param_grad", "kind": "param_grad", "l2": 4.0, "posinf": 2})]
    n = grad_norms(items, clip_norm=1.0)
    torch_total = torch.nn.utils.get_total_norm([torch.tensor([3.0, float("nan")]), torch.tensor([4.0, float("inf")])])
    assert n.total[0] == 5.0 and np.isnan(n.total[1]) and torch_total.isnan()
    assert np.isinf(n.norms[1, 1])


def test_clip_norm_needs_param_grads_and_a_positive_number():
    model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="param_grads=True"):
        hookstats.attach(model, history=True, clip_norm=1.0)
    with pytest.raises(ValueError, match="clip_norm"):
        hookstats.attach(model, history=True, param_grads=True, clip_norm=0.0)


def test_a_step_with_grad_norms_makes_no_host_sync():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = hookstats.attach(model, param_grads=True, history=True, log_every=1000, clip_norm=1.0)
    x = torch.randn(8, 4)

    def step():
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    step()
    with no_host_sync():
        for _ in range(3):
            step()
    assert mon.grad_norms(1.0).steps == [0, 1, 2, 3]
    mon.remove()


def test_the_norms_under_torch_compile():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mon, want = train(steps=6, compiled=True, clip_norm=CLIP)
    check(mon.grad_norms(CLIP), want)
    mon.remove()


def test_group_needs_torch_distributed_and_is_all_or_a_process_group():
    mon, _ = train(steps=2)
    with pytest.raises(ValueError, match="torch.distributed initialized"):
        mon.grad_norms(group="all")
    with pytest.raises(ValueError, match="ProcessGroup"):
        mon.grad_norms(group="world")
    mon.remove()
