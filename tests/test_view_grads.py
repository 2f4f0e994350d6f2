"""Every hooked output that requires grad gets its gradient measured exactly, or a warning naming the target:
outputs of every layout (views, channels_last, tuples, views of the module's input), followed by every kind
of in-place op (ReLU(inplace=True) as a module, F.relu_, x.add_, Dropout(inplace=True), one after the output
was already used). The oracle: the same model run again with the test's own forward hook, which hands on a
clone of the output (not a view) and takes its gradient with a tensor hook."""
import copy
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import oracle
from torch import nn

import hookstats
from hookstats.records import finalize


class Slice(nn.Module):
    """A view of its input: x[..., :6] scaled in place first (so it has a parameter and is hooked)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x)[..., :6]


class Flat(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 2, 3, padding=1)

    def forward(self, x):
        return self.conv(x).flatten(1)  # a view of the conv's output


LAYOUTS = {  # name: (module, input shape, channels_last, view)
    "linear 2-d": (lambda: nn.Linear(8, 8), (6, 8), False, False),
    "linear 3-d": (lambda: nn.Linear(8, 8), (2, 3, 8), False, True),
    "conv channels_last": (lambda: nn.Conv2d(3, 4, 3, padding=1), (2, 3, 5, 5), True, False),
    "attention tuple": (lambda: nn.MultiheadAttention(8, 2, batch_first=True), (2, 3, 8), False, True),
    "lstm tuple": (lambda: nn.LSTM(8, 8, batch_first=True), (2, 3, 8), False, True),
    "view of a submodule's output": (Slice, (2, 3, 8), False, True),
    "flatten": (Flat, (2, 3, 4, 4), False, True),
    "flatten of its input": (lambda: nn.Flatten(1), (2, 3, 4, 4), False, True),
}
IN_PLACE = ["none", "ReLU(inplace=True)", "F.relu_", "add_", "Dropout(inplace=True)", "used, then relu_"]


class Parent(nn.Module):
    def __init__(self, layout, in_place):
        super().__init__()
        make, _, channels_last, _ = LAYOUTS[layout]
        self.m = make()
        if channels_last:
            self.m = self.m.to(memory_format=torch.channels_last)
        self.act = nn.ReLU(inplace=True)
        self.drop = nn.Dropout(0.5, inplace=True)
        self.in_place = in_place

    def forward(self, x):
        if x.requires_grad:
            x = x * 2.0  # m's input, of which m's output is a view, is not a leaf
        y = self.m(x, x, x) if isinstance(self.m, nn.MultiheadAttention) else self.m(x)
        if isinstance(y, tuple):
            y = y[0]
        z = 0
        if self.in_place == "ReLU(inplace=True)":
            y = self.act(y)
        elif self.in_place == "F.relu_":
            y = F.relu_(y)
        elif self.in_place == "add_":
            y = y.add_(1.0)
        elif self.in_place == "Dropout(inplace=True)":
            y = self.drop(y)
        elif self.in_place == "used, then relu_":
            z = y * 3
            y.relu_()
        return (y + z).square() * 0.5


def grad_target(layout):
    return "m:grad_output[0]" if layout in ("attention tuple", "lstm tuple") else "m:grad_output"


def oracle_gradient(model, x):
    """The gradient w.r.t. m's first output, as a tensor hook on a non-view clone of it sees it."""
    grads = []

    def hook(mod, args, out):
        first = out[0] if isinstance(out, tuple) else out
        c = first.clone()
        c.register_hook(grads.append)
        return (c, *out[1:]) if isinstance(out, tuple) else c

    h = model.m.register_forward_hook(hook)
    torch.manual_seed(1)  # the dropout mask
    model(x).sum().backward()
    h.remove()
    return grads[0]


def assert_matches(rec, g, cfg):
    want = finalize(*oracle(g.detach().double().reshape(-1), cfg), cfg)
    assert rec["count"] == want["count"]
    np.testing.assert_array_equal(rec["hist"], want["hist"])
    np.testing.assert_array_equal(rec["float_hist"], want["float_hist"])  # the default histogram
    np.testing.assert_array_equal(rec["log2_hist"], want["log2_hist"])
    assert rec["mean"] == pytest.approx(want["mean"], rel=1e-5, abs=1e-7)
    assert rec["std"] == pytest.approx(want["std"], rel=1e-5)


# PyTorch itself forbids in-place ops on an LSTM's output (its backward needs it): no such case.
CASES = [(layout, op) for layout in LAYOUTS for op in IN_PLACE if layout != "lstm tuple" or op == "none"]


@pytest.mark.parametrize("layout, in_place", CASES)
def test_every_output_gradient_is_exact_or_named_in_a_warning(layout, in_place):
    torch.manual_seed(0)
    model = Parent(layout, in_place)
    twin = copy.deepcopy(model)
    shape, channels_last = LAYOUTS[layout][1], LAYOUTS[layout][2]
    x = torch.randn(*shape, requires_grad=layout == "flatten of its input")
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    want = oracle_gradient(twin, x)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        mon = hookstats.attach(model, modules=["m"])
        torch.manual_seed(1)
        model(x).sum().backward()
        got = mon.stats()
        mon.remove()
    warned = " ".join(str(w.message) for w in record if "hookstats" in str(w.message))
    target = grad_target(layout)
    if target in warned:
        assert target not in got  # never a partial gradient
        assert LAYOUTS[layout][3] and in_place != "none"  # only views changed in place are left out
    else:
        assert target in got, f"{target}: neither measured nor named in a warning"
        assert_matches(got[target], want, mon.cfg)


def test_in_place_relu_of_a_sequential_after_a_linear_on_3d_input():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True), nn.Linear(8, 1))
    x = torch.randn(2, 3, 8)
    want = {}

    def keep_grad(m, args, out):
        out.register_hook(lambda g: want.setdefault("1", g))

    model[1].register_forward_hook(keep_grad)
    with pytest.warns(RuntimeWarning, match=r"0:grad_output is not measured: the output is a view that an in-place"):
        with hookstats.attach(model, include_paramless=True) as mon:
            model(x).sum().backward()
            got = mon.stats()
    assert "0:grad_output" not in got and "0:output" in got
    assert_matches(got["1:grad_output"], want["1"], mon.cfg)  # the in-place module's own output is measured
    assert_matches(got["2:grad_output"], torch.ones(2, 3, 1), mon.cfg)
