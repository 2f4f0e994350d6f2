"""The eager hook path: the op's eager entry (csrc/ops.cpp accumulate_eager) updates a state exactly as torch.ops
does and declines what it does not take; hooks resolved once still feed every mode, patch and phase; a steady-state
hook call asks torch.compiler.is_compiling() once."""
import os
import sys

import numpy as np
import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import hookstats
from hookstats import accumulate, reference
from hookstats.config import StatsConfig
from hookstats.state import Kind, StateStore, TargetKey

needs_entry = pytest.mark.skipif(accumulate.accumulate_eager_ is None, reason="needs the ahead-of-time built op")


def fresh(cfg=None):
    store = StateStore(cfg or StatsConfig(hist_every=1))
    st = store.state(TargetKey("t", Kind.OUTPUT), torch.device("cpu"), "train")
    return store, st, store.flag(torch.device("cpu"))


def layouts(dtype):
    g = torch.Generator().manual_seed(0)
    base = (torch.randn(4, 6, 5, 7, generator=g) * 3).to(dtype)
    base[0, 0, 0, :3] = torch.tensor([float("nan"), float("inf"), 0.0]).to(dtype)
    return {"contiguous": base, "channels_last": base.to(memory_format=torch.channels_last),
            "strided view": base[:, ::2, 1:], "empty": base[:0], "one value": base[1, 1, 1, 1:2],
            "requires grad": (base.float().requires_grad_() * 1).to(dtype)}


@needs_entry
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("hist", [True, False])
def test_eager_entry_updates_the_state_as_torch_ops_does(dtype, hist):
    for name, x in layouts(dtype).items():
        (s1, a, flag), (s2, b, _) = fresh(), fresh()
        mode = flag if hist else torch.tensor([3], dtype=torch.uint8)  # 3: sampled, no histograms
        for _ in range(2):
            assert accumulate.accumulate_eager_(x, *s1.bound(a, mode)) is True, name
            torch.ops.hookstats.accumulate_.default(x, *s2.bound(b, mode))
        assert torch.equal(a.istate, b.istate), name
        torch.testing.assert_close(a.fstate, b.fstate, rtol=0, atol=0, equal_nan=True, msg=name)
        finite = x.detach().double().numpy()[np.isfinite(x.detach().double().numpy())]
        assert a.istate[0].item() == 2 * x.numel(), name  # the count, against the tensor itself
        if finite.size:
            np.testing.assert_allclose(a.fstate[1].item(), finite.mean(), rtol=0,
                                       atol=1e-6 * np.abs(finite).mean(), err_msg=name)


@needs_entry
def test_eager_entry_declines_what_it_does_not_take_and_changes_nothing():
    class Sub(torch.Tensor):
        pass

    x = torch.randn(8, 8)
    nested = torch.nested.nested_tensor([torch.randn(3), torch.randn(5)])
    declined = {"subclass": x.as_subclass(Sub), "integer": torch.arange(8), "meta": torch.empty(8, device="meta"),
                "nested": nested, "sparse": x.to_sparse(), "complex": torch.randn(4, dtype=torch.complex64)}
    store, st, flag = fresh()
    before = st.fstate.clone(), st.istate.clone()
    for name, t in declined.items():
        assert accumulate.accumulate_eager_(t, *store.bound(st, flag)) is False, name
    with TorchFunctionMode():
        assert accumulate.accumulate_eager_(x, *store.bound(st, flag)) is False
    torch.testing.assert_close(st.fstate, before[0], rtol=0, atol=0, equal_nan=True)
    assert torch.equal(st.istate, before[1])


@needs_entry
def test_eager_entry_raises_the_ops_errors():
    store, st, flag = fresh()
    args = list(store.bound(st, flag))
    args[1] = torch.zeros(7, dtype=torch.int64)  # istate of the wrong size
    with pytest.raises(RuntimeError, match="istate must have"):
        accumulate.accumulate_eager_(torch.randn(3), *args)
    with pytest.raises(TypeError, match="6 arguments"):
        accumulate.accumulate_eager_(torch.randn(3))


@needs_entry
def test_eager_entry_leaves_a_malformed_params_to_the_op():
    """A params that is not a tuple of 5 floats is declined (False, no change), so torch.ops raises the op's
    error naming it."""
    store, st, flag = fresh()
    args = list(store.bound(st, flag))
    good = args[4]
    before = st.fstate.clone(), st.istate.clone()
    for bad in (good[:4], good + (0.0,), list(good), (*good[:3], 40, good[4])):
        args[4] = bad
        assert accumulate.accumulate_eager_(torch.randn(3), *args) is False, bad
    torch.testing.assert_close(st.fstate, before[0], rtol=0, atol=0, equal_nan=True)
    assert torch.equal(st.istate, before[1])
    args[4] = good[:4]
    with pytest.raises(RuntimeError, match="params must have 5 fields"):
        accumulate.accumulate_(torch.randn(3), *args)


class Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += func is torch.ops.hookstats.accumulate_.default
        return func(*args, **(kwargs or {}))


def test_a_dispatch_mode_sees_every_update_of_the_hooks():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(5, 4)
    with hookstats.attach(model):
        model(x).sum().backward()  # resolves the hooks' states
        with Count() as count:
            model(x).sum().backward()
    assert count.ops == 4  # two outputs, two gradients


def test_hooks_follow_an_op_swapped_after_they_resolved_their_state(monkeypatch):
    """A test or benchmark that swaps accumulate_ (the reference, a recorder) after the hooks first ran still gets
    every call: the eager entry runs only while accumulate_ is the compiled op."""
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh())
    x = torch.randn(5, 4)
    seen = []

    def recorder(t, *args):
        seen.append(t.shape)
        return reference.accumulate_(t, *args)
    with hookstats.attach(model) as mon:
        model(x).sum().backward()
        monkeypatch.setattr(accumulate, "accumulate_", recorder)
        model(x).sum().backward()
    assert len(seen) == 2  # the Linear's output and its gradient (Tanh has no parameters: not hooked)
    assert mon.stats()["0:output"]["count"] == 2 * 5 * 8


def test_resolved_hooks_keep_phases_and_pauses_apart():
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh())
    x = torch.randn(5, 4)
    with hookstats.attach(model, eval=True) as mon:
        for _ in range(2):
            model.train()
            model(x).sum().backward()
            model.eval()
            with torch.no_grad():
                model(x)
        mon.pause()
        model.train()
        model(x).sum().backward()
        mon.resume()
        train, ev = mon.stats(), mon.stats(phase="eval")
    assert train["0:output"]["count"] == 2 * 40 and train["0:grad_output"]["count"] == 2 * 40
    assert ev["0:output"]["count"] == 2 * 40 and "0:grad_output" not in ev


def test_a_steady_state_hook_call_asks_is_compiling_once(monkeypatch):
    model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(16, 16), nn.ReLU())])
    x = torch.randn(8, 16)
    calls = []
    real = torch.compiler.is_compiling
    # the package's own folder: a clone in a folder named hookstats holds torch's files under that name too
    package = os.path.dirname(os.path.abspath(hookstats.__file__)) + os.sep

    def counting():
        if os.path.abspath(sys._getframe(1).f_code.co_filename).startswith(package):
            calls.append(sys._getframe(1).f_code.co_name)
        return real()
    with hookstats.attach(model):
        model(x).sum().backward()
        monkeypatch.setattr(torch.compiler, "is_compiling", counting)
        model(x).sum().backward()
    hooks = [c for c in calls if c in ("hook", "on_grad")]
    assert len(hooks) == 8, calls  # one per forward hook call, one per gradient
    assert len(calls) - len(hooks) <= 3, calls  # the step clock's root-forward hooks


def test_a_one_tensor_output_costs_the_hook_frame_the_phase_one_reader_the_op_and_the_tap():
    """The Python functions of hookstats that a steady-state forward runs per hooked module whose output is one
    tensor (outputs and their gradients): the hook, the recompute test, the step clock's phase, the adapter's one
    reader (no leaves walk, no reader per target kind), the op's fast path and the gradient tap; counted as the
    difference between a 4-layer and a 2-layer chain, so the root model's hooks cancel out."""
    package = os.path.dirname(os.path.abspath(hookstats.__file__)) + os.sep

    def calls_in_forward(layers):
        torch.manual_seed(0)
        model = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(16, 16), nn.ReLU())])
        x = torch.randn(8, 16)
        names = []

        def profile(frame, event, arg):
            if event == "call" and os.path.abspath(frame.f_code.co_filename).startswith(package):
                names.append(frame.f_code.co_name)
        with hookstats.attach(model) as mon:
            model(x).sum().backward()  # resolves the hooks' states and taps
            sys.setprofile(profile)
            try:
                model(x)
            finally:
                sys.setprofile(None)
            assert mon.stats()[f"{2 * layers - 2}:output"]["count"] == 2 * 8 * 16
        return names

    two, four = calls_in_forward(2), calls_in_forward(4)
    per_module = (len(four) - len(two)) / 2
    assert per_module == 6, (per_module, four)
