"""Compiled autograd (torch._dynamo.compiled_autograd, what torchtitan's compiled-autograd option turns on): the
backward is traced, hooks included, and run as a graph. Every target a plain backward measures is measured the
same, with an eager or a compiled forward, against hooks of the test's own on a twin model (tests/zoo_oracle.py)."""
import pytest
import torch
from torch import nn
from torch._dynamo import compiled_autograd

import hookstats
from zoo_oracle import Oracle, assert_moments_agree


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(32, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, x):
        return self.norm(self.fc2(self.act(self.fc1(x))))


MODULES = ("fc1", "fc2", "norm")



def train(model, xs, *, compiled_backward, forward=None, before_step=lambda: None, step_done=lambda k: None,
          backward=None):
    """SGD steps on xs; forward(k): what runs step k's forward (default the model); compiled_backward(k): whether
    step k's backward runs under compiled autograd."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for k, x in enumerate(xs):
        loss = (model if forward is None else forward(k))(x).square().mean()
        if backward is not None:
            backward(True)
        if compiled_backward(k):
            with compiled_autograd._enable(torch.compile(backend="aot_eager", fullgraph=True)):
                loss.backward()
        else:
            loss.backward()
        if backward is not None:
            backward(False)
        before_step()
        opt.step()
        opt.zero_grad()
        step_done(k + 1)


@pytest.mark.parametrize("forward", ["eager", "compiled"])
def test_every_target_measured_under_compiled_autograd_as_the_oracle_counts_it(fresh_dynamo, forward):
    torch.manual_seed(0)
    model, ref = Net(), Net()
    ref.load_state_dict(model.state_dict())
    xs = [torch.randn(16, 8, requires_grad=True) for _ in range(4)]

    oracle = Oracle(ref, {n: getattr(ref, n) for n in MODULES}, inputs=True, param_grads=True, input_grads=MODULES)

    def backward(on):
        oracle.backward = on

    def step_done(k):
        oracle.step = k
    train(ref, [x.detach().requires_grad_() for x in xs], compiled_backward=lambda k: False,
          before_step=oracle.before_optimizer_step, step_done=step_done, backward=backward)

    mon = hookstats.attach(model, inputs=True, param_grads=True, input_grads=True)
    compiled = torch.compile(model, backend="aot_eager")
    # a compiled forward first meets an input gradient's target inside the trace (allocated at the next eager
    # point, said once): step 0 runs eagerly, as that warning advises; every later step is compiled both ways
    train(model, xs, forward=lambda k: model if forward == "eager" or k == 0 else compiled,
          compiled_backward=lambda k: k > 0 or forward == "eager")
    got = mon.stats()
    kinds = {"output", "grad_output", "input", "grad_input"}
    want_ids = {f"{m}:{k}" for m in MODULES for k in kinds} | {f"{n}:param_grad" for n, _ in ref.named_parameters()}
    assert oracle.targets("train") == want_ids  # the oracle is not vacuous
    assert set(got) == want_ids
    assert oracle.steps() == [0, 1, 2, 3]
    assert_moments_agree(oracle, got, want_ids, mon.cfg)
    mon.remove()
