"""Copies of a monitored model (copy.deepcopy, EMA / AveragedModel, pickle, torch.save) are not monitored:
they run, never feed the original's monitor, and can get a monitor of their own."""
import copy
import io
import pickle

import numpy as np
import pytest
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel

import hookstats

EVERYTHING = dict(inputs=True, input_grads=True, param_grads=True, separate_calls=True, history=True,
                  include_paramless=True)


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 12), nn.LayerNorm(12), nn.Linear(12, 3))


def counts(mon):
    return {tid: rec["count"] for tid, rec in mon.stats().items()}


def run(model, x):
    model(x).square().mean().backward()


def own_output_counts(model, x):
    """Elements each module outputs, counted by hooks of the test's own."""
    seen = {}
    handles = [m.register_forward_hook(lambda m, a, out, n=n: seen.__setitem__(n, seen.get(n, 0) + out.numel()))
               for n, m in model.named_modules() if n]
    model(x)
    for h in handles:
        h.remove()
    return seen


@pytest.mark.parametrize("removed_first", [False, True], ids=["attached", "removed"])
def test_a_deepcopy_never_feeds_the_original_and_can_be_monitored_itself(removed_first):
    model = net()
    mon = hookstats.attach(model, **EVERYTHING)
    x = torch.randn(5, 6)
    run(model, x)
    twin = copy.deepcopy(model)
    if removed_first:
        mon.remove()
    before = counts(mon)
    run(twin, x)
    twin(x)
    assert counts(mon) == before
    with hookstats.attach(twin, modules=["0", "4"]) as mon2:
        run(twin, x)
    want = own_output_counts(twin, x)
    got = mon2.stats()
    assert {t: got[t]["count"] for t in ("0:output", "4:output")} == {"0:output": want["0"], "4:output": want["4"]}
    assert counts(mon) == before
    mon.remove()


def test_an_ema_averaged_model_made_while_attached_is_not_monitored():
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = hookstats.attach(model, param_grads=True)
    ema = AveragedModel(model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.9))
    xs = [torch.randn(5, 6) for _ in range(3)]
    for x in xs:
        run(model, x)
        opt.step()
        opt.zero_grad()
        ema.update_parameters(model)
        with torch.no_grad():
            ema(x)  # evaluating the EMA model between steps, in training mode
    got = mon.stats()
    # the original's statistics are those of its own three steps only
    assert got["0:output"]["count"] == 3 * 5 * 12
    assert got["0:grad_output"]["count"] == 3 * 5 * 12
    assert got["4.weight:param_grad"]["count"] == 3 * 3 * 12
    mon.remove()
    ema(xs[0])
    assert mon.stats()["0:output"]["count"] == 3 * 5 * 12


@pytest.mark.parametrize("save", ["pickle", "torch.save"])
def test_a_model_saved_while_attached_loads_unmonitored_and_runnable(save):
    model = net()
    mon = hookstats.attach(model, **EVERYTHING)
    x = torch.randn(5, 6)
    run(model, x)
    if save == "pickle":
        loaded = pickle.loads(pickle.dumps(model))
    else:
        buf = io.BytesIO()
        torch.save(model, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)
    before = counts(mon)
    run(loaded, x)
    assert counts(mon) == before
    mon.remove()
    with torch.no_grad():
        np.testing.assert_array_equal(loaded(x).numpy(), model(x).numpy())
    with hookstats.attach(loaded) as mon2:
        run(loaded, x)
    assert mon2.stats()["2:output"]["count"] == 5 * 12
