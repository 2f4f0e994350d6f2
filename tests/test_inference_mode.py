"""torch.inference_mode() validation: a state first reached inside inference mode (a sanity validation pass before
training, as Lightning runs one; a module without parameters, whose state is made when first called) must stay
updatable by the train steps after it. Every target, train and eval, against the test's own hooks on a twin model
(tests/zoo_oracle.py)."""
import numpy as np
import pytest
import torch
from torch import nn

import hookstats
from zoo_oracle import Oracle


def net():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def loop(model, xs, vs, *, oracle=None):
    """A sanity validation pass under inference_mode, then per step a train step and validation passes under
    inference_mode and no_grad."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def validate(v, mode):
        model.eval()
        if oracle is not None:
            oracle.phase = "eval"
        with mode():
            model(v)
        model.train()

    validate(vs[0], torch.inference_mode)
    for k, x in enumerate(xs):
        if oracle is not None:
            oracle.step = k
        model(x).square().mean().backward()
        if oracle is not None:
            oracle.before_optimizer_step()
        opt.step()
        opt.zero_grad()
        validate(vs[2 * k + 1], torch.inference_mode)
        validate(vs[2 * k + 2], torch.no_grad)


@pytest.mark.parametrize("history", [False, True])
def test_states_first_reached_in_inference_mode_take_the_train_steps_after_it(history):
    torch.manual_seed(0)
    model, ref = net(), net()
    ref.load_state_dict(model.state_dict())
    xs = [torch.randn(4, 8) for _ in range(3)]
    vs = [torch.randn(5, 8) for _ in range(2 * len(xs) + 1)]
    oracle = Oracle(ref, {n: m for n, m in ref.named_children()}, eval=True, param_grads=True)
    loop(ref, xs, vs, oracle=oracle)

    mon = hookstats.attach(model, eval=True, include_paramless=True, param_grads=True, history=history)
    loop(model, xs, vs)
    for phase in ("train", "eval"):
        got = mon.stats(phase=phase)
        want = {t for t in oracle.targets(phase)}
        assert "1:output" in want and set(got) - {"Sequential:output", "Sequential:grad_output"} == want, phase
        for tid in sorted(want):
            exp = oracle.expected(phase, tid, oracle.steps(phase), mon.cfg)
            assert got[tid]["count"] == exp["count"], (phase, tid)
            for field in ("mean", "std", "min", "max"):
                np.testing.assert_allclose(got[tid][field], exp[field], rtol=1e-5, atol=1e-7,
                                           err_msg=f"{phase} {tid} {field}")
    mon.remove()
