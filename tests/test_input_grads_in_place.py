"""input_grads=True on models that modify tensors in place around hooked modules, however the modules are called
(torchvision's BasicBlock/Bottleneck, x.add_() after a Linear, HF models): the user's forward and backward run
and give bit-identical results to no monitor, and each grad_input target holds exactly the gradient through that
module, by the test's own hooks in float64 (each input replaced by a clone whose gradient is kept)."""
import copy
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import hookstats
from hookstats.selection import module_names


def conv3x3(i, o, stride=1):
    return nn.Conv2d(i, o, 3, stride, padding=1, bias=False)


class BasicBlock(nn.Module):  # torchvision.models.resnet.BasicBlock
    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1, self.bn1 = conv3x3(inplanes, planes, stride), nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2, self.bn2 = conv3x3(planes, planes), nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class Bottleneck(nn.Module):  # torchvision.models.resnet.Bottleneck
    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(inplanes, planes, 1, bias=False), nn.BatchNorm2d(planes)
        self.conv2, self.bn2 = conv3x3(planes, planes, stride), nn.BatchNorm2d(planes)
        self.conv3, self.bn3 = nn.Conv2d(planes, planes * 4, 1, bias=False), nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNetish(nn.Module):
    def __init__(self, block):
        super().__init__()
        self.conv1, self.bn1, self.relu = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(True)
        e = 4 if block is Bottleneck else 1
        down = nn.Sequential(nn.Conv2d(8, 8 * e, 1, stride=2, bias=False), nn.BatchNorm2d(8 * e))
        self.layer1 = nn.Sequential(block(8, 8, 2, down), block(8 * e, 8, 1, None if e == 1 else None))
        if e != 1:
            self.layer1[1] = block(8 * e, 8, 1, None)
        self.fc = nn.Linear(8 * e, 3)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer1(x)
        return self.fc(torch.flatten(x.mean((2, 3)), 1))


class AddAfterLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(5, 7), nn.Linear(7, 7), nn.Linear(7, 2)

    def forward(self, x):
        h = self.fc1(x)
        h.add_(1.0)  # in place on a hooked module's output
        g = self.fc2(h)
        g.mul_(torch.tanh(g.detach()))
        x.data  # noqa: B018
        return self.fc3(g).relu_()


class ReusedInPlace(nn.Module):
    """One Linear called twice per forward, an in-place op on each output, and an input used twice."""

    def __init__(self):
        super().__init__()
        self.fc, self.out = nn.Linear(6, 6), nn.Linear(6, 1)

    def forward(self, x):
        a = self.fc(x)
        a.relu_()
        b = self.fc(a * 0.5)
        b.sigmoid_()
        return self.out(b + x)


def oracle_grad_inputs(model, names, run, separate=False):
    """{target id: [float64 gradients]}: each selected module's positional tensor inputs that require grad are
    replaced by clones whose gradient is kept (what flows back through that call only); separate: per call."""
    mods, seen, hs, calls = module_names(model), {}, [], {}

    def pre(name):
        def hook(m, args):
            call = calls[name] = calls.get(name, -1) + 1
            new = list(args)
            for i, a in enumerate(args):
                if isinstance(a, torch.Tensor) and a.requires_grad and torch.is_grad_enabled():
                    c = a.clone()
                    leaf = ("" if i == 0 else f"[{i}]") + (f"@{call}" if separate else "")
                    c.register_hook(lambda g, tid=f"{name}:grad_input{leaf}": seen.setdefault(tid, []).append(
                        g.detach().double().reshape(-1)))
                    new[i] = c
            return tuple(new)
        return hook
    for n in names:
        hs.append(mods[n].register_forward_pre_hook(pre(n)))
    try:
        run(model)
    finally:
        for h in hs:
            h.remove()
    return seen


def assert_stats(rec, gs):
    v = torch.cat(gs).numpy()
    assert rec["count"] == v.size
    assert rec["mean"] == pytest.approx(v.mean(), rel=1e-9, abs=1e-12 * (np.abs(v).max() + 1e-300))
    if v.size > 1:
        assert rec["std"] == pytest.approx(v.std(ddof=1), rel=1e-9, abs=1e-300)
    assert (rec["min"], rec["max"]) == (v.min(), v.max())


def train_step(x_shape, x_grad=False, loss=lambda y: (y * y).sum()):
    def run(model):
        torch.manual_seed(1)
        x = torch.randn(*x_shape, dtype=torch.float64, requires_grad=x_grad)
        y = model(x)
        loss(y).backward()
        return x, y
    return run


def check_model(make, run, expect_targets=None, attach_kw=None, n_steps=2):
    torch.manual_seed(0)
    plain = make().double()
    hooked, oracle_model = copy.deepcopy(plain), copy.deepcopy(plain)
    mon = hookstats.attach(hooked, input_grads=True, **(attach_kw or {}))
    names = list(mon.modules)
    want = {}
    for _ in range(n_steps):
        xp, yp = run(plain)
        xh, yh = run(hooked)
        # the user's forward and backward: bit-identical with and without the monitor
        assert torch.equal(yp, yh)
        if xp.requires_grad:
            assert torch.equal(xp.grad, xh.grad)
        for (n, p), (_, q) in zip(plain.named_parameters(), hooked.named_parameters()):
            assert torch.equal(p.grad, q.grad), n
            p.grad = q.grad = None
        separate = (attach_kw or {}).get("separate_calls", False)
        for tid, gs in oracle_grad_inputs(oracle_model, names, run, separate).items():
            want.setdefault(tid, []).extend(gs)
        oracle_model.zero_grad(set_to_none=True)
    mon.remove()
    got = mon.stats(kind="grad_input")
    assert set(got) == set(want), (sorted(set(got) ^ set(want)))
    if expect_targets is not None:
        assert expect_targets <= set(got)
    for tid, gs in want.items():
        assert_stats(got[tid], gs)
    return mon, got


@pytest.mark.parametrize("block", [BasicBlock, Bottleneck])
@pytest.mark.parametrize("x_grad", [False, True], ids=["x", "x_requires_grad"])
def test_resnet_blocks_with_in_place_relu_after_bn(block, x_grad):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to leave out, nothing to say
        _, got = check_model(lambda: ResNetish(block), train_step((2, 3, 8, 8), x_grad))
    assert {"layer1.0.conv1:grad_input", "layer1.0.bn1:grad_input", "layer1.0.conv2:grad_input",
            "layer1.0.downsample.0:grad_input", "fc:grad_input"} <= set(got)
    assert ("conv1:grad_input" in got) == x_grad


def test_add_after_linear_with_an_input_that_requires_grad():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, got = check_model(AddAfterLinear, train_step((4, 5), x_grad=True))
    assert set(got) == {"fc1:grad_input", "fc2:grad_input", "fc3:grad_input"}


def test_a_module_called_twice_with_in_place_ops_on_both_outputs():
    _, got = check_model(ReusedInPlace, train_step((3, 6), x_grad=True))
    assert got["fc:grad_input"]["count"] == 2 * 2 * 3 * 6  # two calls, two steps
    _, apart = check_model(ReusedInPlace, train_step((3, 6), x_grad=True), attach_kw={"separate_calls": True})
    assert {"fc:grad_input@0", "fc:grad_input@1", "out:grad_input@0"} == set(apart)


class ChangesItsInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(4))

    def forward(self, x):
        x.mul_(2)  # in place on its own input: the gradient through it cannot be read at the input's node
        return x * self.scale


def test_modules_that_modify_their_input_in_place_are_left_out_with_a_warning_naming_them():
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.ReLU(inplace=True), nn.Dropout(0.0)), nn.Linear(4, 4),
                          ChangesItsInput(), nn.ReLU(inplace=True), nn.Linear(4, 1)).double()
    ref = copy.deepcopy(model)
    mon = hookstats.attach(model, input_grads=True, include_paramless=True)
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    with pytest.warns(RuntimeWarning) as record:
        y = model(x)
        y.sum().backward()
    said = " ".join(str(w.message) for w in record)
    for tid in ("1:grad_input", "1.0:grad_input", "3:grad_input", "4:grad_input"):
        assert tid in said, said
    assert "modifies its input in place" in said
    y2 = ref(x2)
    y2.sum().backward()
    assert torch.equal(y, y2) and torch.equal(x.grad, x2.grad)
    mon.remove()
    got = mon.stats(kind="grad_input")
    assert set(got) == {"Sequential:grad_input", "0:grad_input", "1.1:grad_input", "2:grad_input", "5:grad_input"}
    want = oracle_grad_inputs(ref, ["Sequential", "0", "2", "5"],
                              lambda m: m(torch.randn(3, 4, dtype=torch.float64, requires_grad=True)).sum().backward())
    assert want["0:grad_input"][0].numel() == got["0:grad_input"]["count"]


class FlattenThenInPlace(nn.Module):
    """An output that is a view of the module's input (Flatten), changed in place after the module returned."""

    def __init__(self):
        super().__init__()
        self.fc0, self.flat, self.fc = nn.Linear(4, 4), nn.Flatten(), nn.Linear(8, 1)

    def forward(self, x):
        h = self.flat(self.fc0(x))
        h.relu_()
        return self.fc(h)


def test_an_output_aliasing_the_input_changed_later_is_left_out_never_measured_partly():
    model = FlattenThenInPlace().double()
    mon = hookstats.attach(model, input_grads=True, include_paramless=True)
    with pytest.warns(RuntimeWarning, match="flat:grad_input"):
        model(torch.randn(3, 2, 4, dtype=torch.float64)).sum().backward()
        mon.stats()
    mon.remove()
    got = mon.stats(kind="grad_input")
    assert "flat:grad_input" not in got and {"fc:grad_input"} <= set(got)


def hf_run(vocab):
    def run(model):
        torch.manual_seed(1)
        ids = torch.randint(0, vocab, (2, 7))
        out = model(input_ids=ids)
        (out.last_hidden_state.double() ** 2).sum().backward()
        return ids, out.last_hidden_state
    return run


@pytest.mark.parametrize("arch", ["bert", "gpt2"])
def test_hf_models_with_input_grads(arch):
    transformers = pytest.importorskip("transformers")
    if arch == "bert":
        cfg = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=32, max_position_embeddings=16, hidden_dropout_prob=0.0,
                                      attention_probs_dropout_prob=0.0)
        make = lambda: transformers.BertModel(cfg, add_pooling_layer=False)  # noqa: E731
    else:
        cfg = transformers.GPT2Config(vocab_size=50, n_embd=16, n_layer=2, n_head=2, n_positions=16, resid_pdrop=0.0,
                                      embd_pdrop=0.0, attn_pdrop=0.0)
        make = lambda: transformers.GPT2Model(cfg)  # noqa: E731
    _, got = check_model(make, hf_run(50))
    assert len(got) >= 8
