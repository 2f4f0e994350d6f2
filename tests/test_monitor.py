"""attach() and Monitor: selection, steps and sampling, phases, removal, odd outputs, no host sync."""
import contextlib
import json

import numpy as np
import pytest
import torch
from helpers import HostSyncError, no_host_sync, oracle
from torch import nn

import hookstats
from hookstats.records import finalize


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.BatchNorm1d(16), nn.Linear(16, 2))


def all_hooks(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
               + len(getattr(m, "_backward_pre_hooks", {})) for m in model.modules())


def test_default_hooks_every_module_with_its_own_parameters():
    model = mlp()
    with hookstats.attach(model) as mon:
        assert set(mon.modules) == {"0", "2", "3", "4"}  # not the ReLU, not the container


def test_selection_by_glob_type_and_exclude():
    model = mlp()
    assert set(hookstats.attach(model, modules=["[01]"]).modules) == {"0", "1"}
    assert set(hookstats.attach(model, types=[nn.Linear]).modules) == {"0", "2", "4"}
    assert set(hookstats.attach(model, exclude=["3", "4"]).modules) == {"0", "2"}
    assert set(hookstats.attach(model, include_paramless=True).modules) == {"Sequential", "0", "1", "2", "3", "4"}
    assert set(hookstats.attach(model, modules=[""]).modules) == {"Sequential"}  # the root by its name in named_modules()
    assert set(hookstats.attach(model, modules=["Seq*"]).modules) == {"Sequential"}


@pytest.mark.parametrize("kwargs, match", [
    ({"modules": ["encoder"]}, "no module of the model matches 'encoder'"),
    ({"exclude": ["nope*"]}, "no module of the model matches 'nope\\*'"),
    ({"modules": "0"}, "list of names"),
    ({"types": [int]}, "nn.Module subclasses"),
    ({"nbins": 0}, "nbins"),
    ({"nbins": 257}, "nbins"),
    ({"lo": 1.0, "hi": 1.0}, "lo must be < hi"),
    ({"lo": float("nan")}, "lo must be a finite"),
    ({"eps": -1e-3}, "eps must be >= 0"),
    ({"near_zero": "fastai"}, "near_zero"),
    ({"every": 0}, "every"),
    ({"lo": -1e39}, "lo must be a finite number within float32's range"),
    ({"hi": 1e39}, "hi must be a finite number within float32's range"),
    ({"lo": 1.0, "hi": 1.0 + 1e-12}, "lo and hi must differ in float32"),
    ({"lo": 0.0, "hi": 1e-38}, "bins are too narrow for float32"),
    ({"eps": 1e-50}, "eps=1e-50 rounds to 0 in float32"),
    ({"eps": 1e39}, "eps must be a finite number within float32's range"),
    ({"nbins": True}, "nbins must be an int, got bool"),
    ({"nbins": 4.0}, "nbins must be an int, got float"),
    ({"lo": "0"}, "lo must be a number, got str"),
    ({"linear_hist": "no"}, "linear_hist must be True or False, got str 'no'"),
    ({"log_hist": 0}, "log_hist must be True or False, got int"),
    ({"config": {"nbins": 4}}, "config must be a hookstats.StatsConfig"),
    ({"config": hookstats.StatsConfig(), "nbins": 4}, "either config= or its fields"),
    ({"grads": "no"}, "grads must be True or False"),
    ({"eval": "yes"}, "eval must be True or False"),
    ({"include_paramless": 1}, "include_paramless must be True or False"),
    ({"separate_calls": "yes"}, "separate_calls must be True or False"),
    ({"every": 2.0}, "every must be an int, got float"),
    ({"steps": "epoch"}, "steps must be one of 'forward', 'manual'"),
    ({"history": 0}, "history must be an int >= 1"),
    ({"history": "yes"}, "history must be an int"),
    ({"log_every": 0}, "log_every must be an int >= 1"),
    ({"keep": -1}, "keep must be an int >= 1"),
    ({"alerts": "on"}, "alerts must be True, False or an AlertRules"),
    ({"sinks": "x.csv"}, "sinks must be a list"),
])
def test_bad_configuration_is_a_value_error_at_attach(kwargs, match):
    model = mlp()
    with pytest.raises(ValueError, match=match):
        hookstats.attach(model, **kwargs)
    assert all_hooks(model) == 0


@pytest.mark.parametrize("model", [None, lambda x: x, nn.Linear], ids=["None", "lambda", "a class"])
def test_attach_to_something_not_a_module_is_a_value_error_naming_it(model):
    with pytest.raises(ValueError, match="attach: model must be an nn.Module"):
        hookstats.attach(model)


def captured_outputs(model, names, x, steps=1):
    """Outputs of the named modules, captured by our own hooks (independent of hookstats)."""
    seen = {n: [] for n in names}
    mods = dict(model.named_modules())
    hs = [mods[n].register_forward_hook(lambda m, a, o, n=n: seen[n].append(o.detach().clone())) for n in names]
    for _ in range(steps):
        model(x)
    for h in hs:
        h.remove()
    return {n: torch.cat([t.reshape(-1) for t in v]) for n, v in seen.items()}


def test_statistics_match_the_oracle_on_the_captured_outputs():
    model, x = mlp(), torch.randn(32, 8)
    ref_model = mlp()
    with hookstats.attach(model, nbins=16, lo=-2, hi=2, hist_every=1) as mon:
        for _ in range(3):
            model(x)
    want = captured_outputs(ref_model, ["0", "2", "3", "4"], x, steps=3)
    got = mon.stats(kind="output")
    assert set(got) == {"0:output", "2:output", "3:output", "4:output"}
    for name, t in want.items():
        f, i = oracle(t, mon.cfg)
        rec, exp = got[f"{name}:output"], finalize(f, i, mon.cfg)
        assert rec["count"] == exp["count"] == t.numel()
        np.testing.assert_array_equal(rec["hist"], exp["hist"])
        np.testing.assert_array_equal(rec["float_hist"], exp["float_hist"])  # the default histogram
        np.testing.assert_array_equal(rec["log2_hist"], exp["log2_hist"])
        assert rec["near_zero_count"] == exp["near_zero_count"]
        assert rec["min"] == exp["min"] and rec["max"] == exp["max"]
        assert rec["mean"] == pytest.approx(exp["mean"], rel=1e-6, abs=1e-7)
        assert rec["std"] == pytest.approx(exp["std"], rel=1e-6)
        assert rec["std"] == pytest.approx(t.double().std().item(), rel=1e-6)


def test_every_n_measures_steps_0_n_2n():
    model, x = mlp(), torch.randn(4, 8)
    with hookstats.attach(model, every=2) as mon:
        for _ in range(5):  # steps 0..4: 0, 2, 4 measured
            model(x)
    assert mon.stats()["0:output"]["count"] == 3 * 4 * 16
    assert mon.step_count == 4


def test_manual_steps_replace_forward_counting():
    model, x = mlp(), torch.randn(4, 8)
    with hookstats.attach(model, every=2, steps="manual") as mon:
        model(x)
        model(x)  # still step 0: measured twice (e.g. gradient accumulation micro-batches)
        mon.step()
        model(x)  # step 1: skipped
        mon.step()
        model(x)  # step 2: measured
    assert mon.stats()["0:output"]["count"] == 3 * 4 * 16
    with pytest.raises(ValueError, match="steps"):
        hookstats.attach(model, steps="epoch")


def test_eval_is_not_measured_by_default_and_kept_apart_when_asked():
    model, x = mlp(), torch.randn(4, 8)
    with hookstats.attach(model) as mon:
        model(x)
        model.eval()
        model(x * 100)
    assert mon.stats()["0:output"]["count"] == 64
    assert mon.stats(phase="eval") == {}

    model.train()
    with hookstats.attach(model, eval=True) as mon:
        model(x)
        model.eval()
        model(x)
        model(x)
        model.train()
        model(x)
    assert mon.stats()["0:output"]["count"] == 2 * 64
    assert mon.stats(phase="eval")["0:output"]["count"] == 2 * 64
    with pytest.raises(ValueError, match="phase"):
        mon.stats(phase="valid")


def test_pause_resume_and_reset():
    model, x = mlp(), torch.randn(4, 8)
    mon = hookstats.attach(model, linear_hist=True)
    model(x)
    mon.pause()
    model(x)
    mon.resume()
    model(x)
    assert mon.stats()["0:output"]["count"] == 2 * 64
    mon.reset()
    rec = mon.stats()["0:output"]
    assert rec["count"] == 0 and np.isnan(rec["min"]) and rec["hist"].sum() == 0 and rec["float_hist"].sum() == 0
    model(x)
    assert mon.stats()["0:output"]["count"] == 64
    mon.remove()


def test_remove_leaves_no_hook_and_is_idempotent():
    model = mlp()
    before = all_hooks(model)
    mon = hookstats.attach(model, inputs=True, include_paramless=True)
    assert all_hooks(model) > before
    mon.remove()
    mon.remove()
    assert all_hooks(model) == before == 0
    assert not mon.attached


def test_exception_inside_with_removes_hooks_and_propagates():
    model = mlp()
    with pytest.raises(KeyError):
        with hookstats.attach(model, inputs=True):
            model(torch.randn(2, 8))
            raise KeyError("boom")
    assert all_hooks(model) == 0


def test_a_module_called_twice_per_step_counts_both_calls():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(self.lin(x))

    model = Twice()
    with hookstats.attach(model) as mon:
        model(torch.randn(3, 4))
    assert mon.stats()["lin:output"]["count"] == 2 * 12


def test_tuple_and_dict_outputs_measure_each_float_leaf_and_skip_the_rest():
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

        def forward(self, x):
            y = x * self.w
            return y, y.argmax(-1), {"a": y + 1, "b": None, "c": y > 0}, [y.to(torch.complex64)]

    model = Odd()
    with hookstats.attach(model) as mon:
        model(torch.randn(5, 3))
    got = mon.stats()
    assert set(got) == {"Odd:output[0]", "Odd:output[2]['a']"}
    assert got["Odd:output[2]['a']"]["count"] == 15


def test_lstm_tuple_outputs():
    model = nn.LSTM(4, 6, batch_first=True)
    with hookstats.attach(model) as mon:
        model(torch.randn(2, 5, 4))
    got = mon.stats()
    assert {"LSTM:output[0]", "LSTM:output[1][0]", "LSTM:output[1][1]"} <= set(got)
    assert got["LSTM:output[0]"]["count"] == 2 * 5 * 6


def test_in_place_activation_after_the_hooked_layer_does_not_change_what_was_measured():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(inplace=True))
    with hookstats.attach(model) as mon:
        model(torch.randn(64, 8))
    rec = mon.stats()["0:output"]
    assert rec["min"] < 0  # measured before the in-place ReLU overwrote the negatives
    assert rec["near_zero"] < 0.1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64], ids=str)
def test_low_and_high_precision_models(dtype):
    model = nn.Linear(8, 8).to(dtype)
    x = torch.randn(16, 8, dtype=dtype)
    with hookstats.attach(model) as mon:
        y = model(x)
    f, i = oracle(y, mon.cfg)
    rec = mon.stats()["Linear:output"]
    assert rec["count"] == 128 and rec["max"] == f[4]
    np.testing.assert_array_equal(rec["hist"], finalize(f, i, mon.cfg)["hist"])
    np.testing.assert_array_equal(rec["float_hist"], finalize(f, i, mon.cfg)["float_hist"])  # the default histogram


@pytest.mark.parametrize("backend", ["compiled", "reference"])
def test_forward_with_hooks_runs_without_host_sync(backend):
    from hookstats.tools.bench import reference_backend
    model, x = mlp(), torch.randn(16, 8)
    with reference_backend() if backend == "reference" else contextlib.nullcontext():
        mon = hookstats.attach(model, inputs=True)
        model(x)  # first call may allocate lazily created states
        with no_host_sync() as ops:
            model(x)
        mon.remove()
    if backend == "compiled":
        assert any("hookstats.accumulate_" in o for o in ops)
    else:  # the reference op's own aten ops ran under the guard
        assert not any("hookstats" in o for o in ops) and any("scatter_add" in o or "index_add" in o for o in ops), ops


def test_the_host_sync_guard_can_fail():
    with pytest.raises(HostSyncError):
        with no_host_sync():
            torch.randn(3).sum().item()


def test_stats_can_be_read_at_any_time_without_disturbing_training():
    model, x = mlp(), torch.randn(4, 8)
    with hookstats.attach(model) as mon:
        model(x)
        first = mon.stats()["0:output"]["count"]
        model(x)
    assert first == 64 and mon.stats()["0:output"]["count"] == 128


def test_stats_of_a_kind_that_does_not_exist_is_an_error_listing_the_kinds():
    model = mlp()
    with hookstats.attach(model) as mon:
        model(torch.randn(4, 8)).sum().backward()
    assert set(mon.stats(kind="grad_output")) == {"0:grad_output", "2:grad_output", "3:grad_output", "4:grad_output"}
    with pytest.raises(ValueError, match="kind must be one of 'output', 'grad_output', .*'watch_grad'; got 'grad'"):
        mon.stats(kind="grad")
    with pytest.raises(ValueError, match="phase must be one of 'train', 'eval'; got 'valid'"):
        mon.stats(phase="valid")


def test_the_root_model_is_named_after_its_class():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(4))
            self.Net = nn.Linear(4, 4)  # a submodule with the class's name: the root becomes "Net_root"

        def forward(self, x):
            return self.Net(x * self.scale)

    model = Net()
    with hookstats.attach(model, param_grads=True) as mon:
        model(torch.randn(3, 4)).sum().backward()
        mon.step()
    assert set(mon.modules) == {"Net_root", "Net"}
    assert {"Net_root:output", "Net_root:grad_output", "Net_root.scale:param_grad", "Net:output"} <= set(mon.stats())


def test_target_kinds_are_an_enum_that_reads_as_plain_strings():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    mon = hookstats.attach(model)
    model(torch.randn(3, 4)).sum().backward()
    assert [k.value for k in hookstats.Kind] == ["output", "grad_output", "input", "grad_input", "param_grad", "param",
                                                 "watch", "watch_grad"]
    kind = mon.stats()["0:output"]["kind"]
    assert kind == "output" and kind is hookstats.Kind.OUTPUT
    assert (str(kind), f"{kind}", repr(kind), json.dumps(kind)) == ("output", "output", "'output'", '"output"')
    assert set(mon.stats(kind=hookstats.Kind.GRAD_OUTPUT)) == set(mon.stats(kind="grad_output")) == {"0:grad_output",
                                                                                                   "2:grad_output"}
    assert {hookstats.TargetKey("0", "output"): 1}[hookstats.TargetKey("0", hookstats.Kind.OUTPUT)] == 1
    with pytest.raises(ValueError, match="kind must be one of"):
        mon.stats(kind="outputs")
    mon.remove()
