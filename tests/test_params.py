"""params=True: the statistics of the parameters themselves ("fc1.weight:param"), measured once per optimizer
step after it stepped (or at mon.step()), against the test's own float64 reading of the weights after each step."""
import warnings

import numpy as np
import pytest
import torch
from helpers import hist_step, no_host_sync, oracle
from torch import nn
from torch._dynamo.utils import counters

import hookstats
from hookstats.records import finalize


def net(dtype=torch.float32):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.LayerNorm(16), nn.Linear(16, 3)).to(dtype)


def read(model, seen):
    """The test's own reading: each parameter's values, appended after each step."""
    for name, p in model.named_parameters():
        seen.setdefault(name, []).append(p.detach().double().reshape(-1).clone())


def assert_params_match(mon, seen, dtype=torch.float32):
    got = mon.stats(kind="param")
    assert set(got) == {f"{name}:param" for name in seen}
    for name, parts in seen.items():
        values = torch.cat(parts)
        rec = got[f"{name}:param"]
        want = finalize(*oracle(values, mon.cfg), mon.cfg)
        assert rec["count"] == want["count"] == values.numel(), name
        np.testing.assert_array_equal(rec["float_hist"], oracle_buckets(parts, dtype, mon.cfg), err_msg=name)
        v = values.numpy()
        assert rec["mean"] == pytest.approx(v.mean(), rel=1e-6, abs=1e-7), name
        assert rec["std"] == pytest.approx(v.std(ddof=1), rel=1e-5, abs=1e-7), name
        assert (rec["min"], rec["max"]) == (v.min(), v.max()), name


def oracle_buckets(parts, dtype, cfg):
    # buckets of the values in their own dtype (the op bins what it reads, not its float64 copy)
    return finalize(*oracle(torch.cat(parts).to(dtype), cfg), cfg)["float_hist"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("opt", ["sgd_momentum", "adam"])
def test_params_are_the_weights_each_optimizer_step_produced(dtype, opt):
    model = net(dtype)
    optimizer = (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if opt == "sgd_momentum"
                 else torch.optim.Adam(model.parameters(), lr=0.05))
    mon = hookstats.attach(model, hist_every=1, params=True, grads=False, outputs=False)
    seen = {}
    for _ in range(4):
        model(torch.randn(8, 6, dtype=dtype)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        read(model, seen)
    assert_params_match(mon, seen, dtype)


def test_gradient_accumulation_measures_once_per_optimizer_step():
    model = net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = hookstats.attach(model, hist_every=1, params=True)  # steps="forward": each micro-batch is a step
    seen = {}
    for _ in range(3):
        for _ in range(4):
            model(torch.randn(8, 6)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        read(model, seen)
    assert_params_match(mon, seen)


def test_several_optimizers_measure_each_their_parameters_after_their_own_step():
    model = net()
    first = torch.optim.SGD(model[0].parameters(), lr=0.1)
    rest = torch.optim.Adam([*model[2].parameters(), *model[3].parameters()], lr=0.05)
    mon = hookstats.attach(model, hist_every=1, params=True, steps="manual")
    seen = {}
    for _ in range(3):
        model(torch.randn(8, 6)).square().mean().backward()
        first.step()
        read(model[0], seen.setdefault("first", {}))
        rest.step()  # a later step of another optimizer must not change what the first one's step recorded
        with torch.no_grad():
            model[0].weight.add_(100.0)  # changed after its optimizer stepped: not what the step produced
        read(model, seen.setdefault("all", {}))
        with torch.no_grad():
            model[0].weight.sub_(100.0)
        first.zero_grad(), rest.zero_grad()
        mon.step()  # measures nothing more: every parameter was measured after its optimizer's step
    mixed = {f"0.{k}": v for k, v in seen["first"].items()}
    mixed.update({k: v for k, v in seen["all"].items() if not k.startswith("0.")})
    assert_params_match(mon, mixed)


def test_without_an_optimizer_mon_step_measures_the_updated_weights_frozen_ones_included():
    model = net()
    model[2].weight.requires_grad_(False)  # frozen: measured too, once per step
    mon = hookstats.attach(model, hist_every=1, params=True, steps="manual")
    seen = {}
    for _ in range(3):
        model(torch.randn(8, 6)).square().mean().backward()
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p -= 0.1 * p.grad
                    p.grad = None
        read(model, seen)
        mon.step()
    assert_params_match(mon, seen)


def test_frozen_parameters_are_measured_once_per_step_beside_an_optimizer():
    model = net()
    model[0].requires_grad_(False)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    mon = hookstats.attach(model, hist_every=1, params=True)
    for _ in range(3):
        model(torch.randn(8, 6)).square().mean().backward()
        optimizer.step()
        optimizer.step()  # a second step in the same step: the stepped weights twice, the frozen ones once
        optimizer.zero_grad()
    got = mon.stats(kind="param")
    for name, p in model.named_parameters():
        assert got[f"{name}:param"]["count"] == (1 if name.startswith("0.") else 2) * 3 * p.numel(), name


def test_every_n_measures_the_sampled_steps_only():
    model = net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = hookstats.attach(model, hist_every=1, params=True, every=2)
    seen = {}
    for k in range(5):
        model(torch.randn(8, 6)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        if k % 2 == 0:
            read(model, seen)
    assert_params_match(mon, seen)


def test_compiled_model_params_are_measured_at_the_eager_optimizer_step():
    torch._dynamo.reset()
    counters.clear()
    model = net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    mon = hookstats.attach(model, hist_every=1, params=True)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    seen = {}
    for _ in range(3):
        compiled(torch.randn(8, 6)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        read(model, seen)
    assert_params_match(mon, seen)
    assert mon.step_count == 3 and not counters["graph_break"]
    torch._dynamo.reset()


def test_measuring_params_reads_nothing_back_to_the_host():
    model = net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = hookstats.attach(model, hist_every=1, params=True, outputs=False, grads=False)
    model(torch.randn(8, 6)).square().mean().backward()
    with no_host_sync() as ops:
        optimizer.step()
    assert any("hookstats" in op for op in ops)
    assert mon.stats(kind="param")["0.weight:param"]["count"] == model[0].weight.numel()


def test_params_reach_the_history_once_per_step():
    model = net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = hookstats.attach(model, hist_every=1, params=True, history=True, log_every=1)
    seen = []
    for _ in range(3):
        model(torch.randn(8, 6)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        seen.append(model[0].weight.detach().double().mean().item())
    mon.remove()
    h = mon.history()
    rows = h[(h["target"] == "0.weight:param") & (h["stat"] == "mean")].sort_values("step")
    np.testing.assert_allclose(rows["value"].to_numpy(), seen, rtol=1e-6)


def test_a_loop_that_never_steps_is_told_params_measured_nothing():
    model = net()
    mon = hookstats.attach(model, hist_every=1, params=True)
    for _ in range(3):
        model(torch.randn(8, 6)).square().mean().backward()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mon.stats()
    assert any("params=True has measured no parameter" in str(w.message) for w in caught)


def test_param_histograms_follow_the_histogram_steps_of_every_other_target():
    model = net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = hookstats.attach(model, params=True, every=1, hist_every=2)
    seen = {}
    for k in range(5):
        model(torch.randn(8, 6)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        if hist_step(k, 1, 2):
            read(model, seen)
    got = mon.stats(kind="param")
    for name, parts in seen.items():
        assert got[f"{name}:param"]["count"] == 5 * parts[0].numel()
        assert got[f"{name}:param"]["hist_count"] == 4 * parts[0].numel()  # steps 0, 1 (the ramp), 2, 4
        np.testing.assert_array_equal(got[f"{name}:param"]["float_hist"], oracle_buckets(parts, torch.float32, mon.cfg))


def test_plan_lists_the_parameter_targets():
    model = net()
    p = hookstats.plan(model, torch.randn(8, 6), speed=False, params=True)
    got = [t.id for t in p.targets if t.id.endswith(":param")]
    assert got == [f"{name}:param" for name, _ in model.named_parameters()]
