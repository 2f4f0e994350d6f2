"""Every hook target (output grads, inputs, input grads, parameter grads, watch) against the float64 oracle
on tensors captured from an unhooked twin model, gradients from torch.autograd.grad; the cases real models
hit (in-place, reuse, containers, checkpointing, frozen params); pass-through and no host sync in backward."""
import contextlib
import dataclasses
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import HostSyncError, exit_without_finalizing, no_host_sync, oracle
from torch import nn
from torch.utils.checkpoint import checkpoint

import hookstats
from hookstats.selection import module_names
from hookstats.tensors import tensor_leaves
from hookstats.records import finalize

pytestmark = pytest.mark.usefixtures("every_step_histograms")  # their oracles count every step's histograms

ALL = dict(inputs=True, grads=True, input_grads=True, param_grads=True)


def assert_matches(rec, t, cfg):
    """rec (a stats() record) holds exactly the statistics of tensor t, by the independent oracle."""
    exp = finalize(*oracle(t.detach().reshape(-1), cfg), cfg)
    assert rec["count"] == exp["count"] == t.numel()
    np.testing.assert_array_equal(rec["hist"], exp["hist"])
    np.testing.assert_array_equal(rec["float_hist"], exp["float_hist"])  # the default histogram
    np.testing.assert_array_equal(rec["log2_hist"], exp["log2_hist"])
    assert rec["near_zero_count"] == exp["near_zero_count"]
    assert (rec["min"], rec["max"]) == (exp["min"], exp["max"])
    spread = exp["std"] if exp["std"] > 0 else 1e-3  # the fused op sums in float32 chunks
    assert rec["mean"] == pytest.approx(exp["mean"], rel=1e-6, abs=1e-6 * spread)
    assert rec["std"] == pytest.approx(exp["std"], rel=1e-5, nan_ok=True)


def cat(ts):
    return torch.cat([t.detach().reshape(-1) for t in ts])


def capture(model, x, loss_fn, names, steps=1):
    """{target id: tensor} of an unhooked model: outputs/inputs by our own forward hooks, their gradients
    by torch.autograd.grad of the same loss, parameter gradients from .grad (summed over `steps` backwards)."""
    mods = module_names(model)
    seen = {}

    def keep(tid, t):
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            seen.setdefault(tid, []).append(t)

    def fwd(name):
        def hook(m, args, out):
            for leaf, t in tensor_leaves(out):
                keep(f"{name}:output{leaf}", t)
            for leaf, t in tensor_leaves(args[0] if len(args) == 1 else args):
                keep(f"{name}:input{leaf}", t)
        return hook

    hs = [mods[n].register_forward_hook(fwd(n)) for n in names]
    model.zero_grad(set_to_none=True)
    grads = {}
    for _ in range(steps):
        seen_before = {k: len(v) for k, v in seen.items()}
        loss = loss_fn(model(x))
        new = [(k, t) for k, v in seen.items() for t in v[seen_before.get(k, 0):] if t.requires_grad]
        gs = torch.autograd.grad(loss, [t for _, t in new], retain_graph=True, allow_unused=True)
        for (k, _), g in zip(new, gs):
            if g is not None:
                grads.setdefault(k.replace(":output", ":grad_output").replace(":input", ":grad_input"), []).append(g)
        loss.backward()
    for h in hs:
        h.remove()
    out = {k: cat(v) for k, v in {**seen, **grads}.items()}
    for n in names:
        for pn, p in mods[n].named_parameters(recurse=False):
            if p.grad is not None:
                out[f"{n + '.' if n else ''}{pn}:param_grad"] = p.grad.detach().clone().reshape(-1)
    return out


def twins(make):
    torch.manual_seed(0)
    a = make()
    b = make()
    b.load_state_dict(a.state_dict())
    return a, b


def mlp():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))


def cnn():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, stride=2),
                         nn.ReLU(), nn.Flatten(), nn.Linear(8 * 2 * 2, 4))


def block():
    return nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)


def run(model, x, loss_fn, steps=1, **kw):
    mon = hookstats.attach(model, **kw)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: param grads are measured at each step
    for _ in range(steps):
        loss_fn(model(x)).backward()
        opt.step()
        opt.zero_grad()
    mon.remove()
    return mon


@pytest.mark.parametrize("make, shape, checks", [
    (mlp, (32, 8), None),
    (cnn, (4, 3, 6, 6), None),
    # grad_input by autograd.grad is the total gradient of the input: equal to "through the module"
    # only for inputs with one consumer, so the residual-fed sublayers' grad_input are not compared
    (block, (2, 5, 16), {"self_attn:grad_input[0]", "norm1:grad_input", "linear1:grad_input",
                         "norm2:grad_input"}),
], ids=["mlp", "cnn", "transformer"])
def test_every_target_matches_the_oracle_on_captured_tensors(make, shape, checks):
    model, ref = twins(make)
    x = torch.randn(*shape)
    loss_fn = lambda y: y.square().mean()  # noqa: E731
    mon = run(model, x, loss_fn, **ALL)
    names = list(mon.modules)
    want = capture(ref, x, loss_fn, names)
    got = mon.stats()
    kinds = {r["kind"] for r in got.values()}
    assert kinds == {"output", "input", "grad_output", "grad_input", "param_grad"}
    compared = 0
    for tid, rec in got.items():
        if checks and tid in checks:
            continue
        if rec["kind"] == "grad_input" and tid not in want:
            continue  # e.g. the first layer: x does not require grad
        assert tid in want, tid
        assert_matches(rec, want[tid], mon.cfg)
        compared += 1
    assert compared >= len(names) * 4


def test_output_gradients_equal_autograd_grad_over_several_steps():
    model, ref = twins(mlp)
    x = torch.randn(16, 8)
    loss_fn = lambda y: F.cross_entropy(y, torch.arange(16) % 3)  # noqa: E731
    mon = run(model, x, loss_fn, steps=3)
    want = capture(ref, x, loss_fn, ["0", "2", "4"], steps=3)
    got = mon.stats(kind="grad_output")
    assert set(got) == {"0:grad_output", "2:grad_output", "4:grad_output"}
    for tid, rec in got.items():
        assert_matches(rec, want[tid], mon.cfg)


def test_in_place_activation_after_the_hooked_layer():
    """Gradient of the layer's own output (before the in-place ReLU), the same as without in-place."""
    torch.manual_seed(0)
    lin = nn.Linear(8, 32)
    model = nn.Sequential(lin, nn.ReLU(inplace=True), nn.Linear(32, 2))
    ref = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    ref.load_state_dict(model.state_dict())
    x = torch.randn(64, 8)
    mon = run(model, x, lambda y: y.sum(), param_grads=True)
    want = capture(ref, x, lambda y: y.sum(), ["0", "2"])
    got = mon.stats()
    assert got["0:output"]["min"] < 0
    for tid in ("0:output", "0:grad_output", "2:grad_output", "0.weight:param_grad"):
        assert_matches(got[tid], want[tid], mon.cfg)


class Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(torch.tanh(self.lin(x)))


def test_a_module_called_twice_counts_both_calls_or_keeps_them_apart():
    model, ref = twins(Twice)
    x = torch.randn(3, 4, requires_grad=True)
    merged = run(model, x, lambda y: y.square().sum(), input_grads=True).stats()
    apart = run(model, x, lambda y: y.square().sum(), input_grads=True, separate_calls=True).stats()
    seen, inputs = [], []
    h = ref.lin.register_forward_hook(lambda m, a, o: seen.append(o) or inputs.append(a[0]))
    y = ref(x)
    h.remove()
    g = torch.autograd.grad(y.square().sum(), seen + inputs)  # each input has lin as its only consumer
    g, gi = g[:2], g[2:]
    cfg = hookstats.StatsConfig()
    assert_matches(merged["lin:output"], cat(seen), cfg)
    assert_matches(merged["lin:grad_output"], cat(g), cfg)
    assert_matches(merged["lin:grad_input"], cat(gi[::-1]), cfg)  # backward reaches the second call first
    for k in (0, 1):
        assert_matches(apart[f"lin:output@{k}"], seen[k], cfg)
        assert_matches(apart[f"lin:grad_output@{k}"], g[k], cfg)
        assert_matches(apart[f"lin:grad_input@{k}"], gi[k], cfg)
        assert apart[f"lin:output@{k}"]["call"] == apart[f"lin:grad_input@{k}"]["call"] == k
    assert "lin:output" not in apart and "lin:grad_input" not in apart


class Siamese(nn.Module):
    """One encoder called on two inputs, the second call's result used twice and the first's scaled: the
    calls' input gradients differ, and only the second call's input requires grad on the first step."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        self.head = nn.Linear(4, 1)

    def forward(self, pair):
        a, b = pair
        za, zb = self.enc(a), self.enc(b)
        return self.head(3 * za + zb * zb)


def test_separate_calls_give_each_call_its_own_input_gradient_with_independent_branches():
    model, ref = twins(Siamese)
    a, b = torch.randn(5, 4, requires_grad=True), torch.randn(5, 4, requires_grad=True)
    mon = hookstats.attach(model, modules=["enc"], input_grads=True, separate_calls=True)
    model((a.detach(), b)).sum().backward()  # call 0's input needs no grad: no grad_input for it
    assert set(mon.stats(kind="grad_input")) == {"enc:grad_input@1"}
    mon.reset()
    model((a, b)).sum().backward()
    got = mon.stats(kind="grad_input")
    mon.remove()
    want = torch.autograd.grad(ref((a, b)).sum(), (a, b))
    for k in (0, 1):
        assert_matches(got[f"enc:grad_input@{k}"], want[k], mon.cfg)


class SelfCalling(nn.Module):
    """Calls itself once on a scaled copy of its first result: the inner call starts after and ends
    before the outer one."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.depth = 0

    def forward(self, x):
        y = self.lin(x)
        if self.depth:
            return y
        self.depth = 1
        try:
            inner = self(y * 100)
        finally:
            self.depth = 0
        return y + 0.01 * inner


def test_calls_are_numbered_when_they_start_so_every_kind_agrees_on_a_module_that_calls_itself():
    model, ref = twins(lambda: nn.Sequential(SelfCalling()))
    x = torch.randn(8, 4, requires_grad=True)
    got = run(model, x, lambda y: y.square().sum(), modules=["0"], inputs=True, input_grads=True,
              separate_calls=True).stats()
    ins, outs = [], []
    h = ref[0].register_forward_hook(lambda m, a, o: ins.append(a[0]) or outs.append(o))
    y = ref(x)
    h.remove()
    ins, outs = ins[::-1], outs[::-1]  # the hook saw the inner call end first: back to start order
    grads = torch.autograd.grad(y.square().sum(), outs + ins)
    cfg = hookstats.StatsConfig()
    for k in (0, 1):
        assert_matches(got[f"0:input@{k}"], ins[k], cfg)
        assert_matches(got[f"0:output@{k}"], outs[k], cfg)
        assert_matches(got[f"0:grad_output@{k}"], grads[k], cfg)
    # the outer call's input feeds only the outer call; the inner call's input (y * 100) only the inner one
    assert_matches(got["0:grad_input@0"], grads[2], cfg)
    assert_matches(got["0:grad_input@1"], grads[3], cfg)


def test_a_submodule_driven_outside_the_root_forward_starts_each_call_at_zero():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    x = torch.randn(3, 4, requires_grad=True)
    mon = hookstats.attach(model, input_grads=True, separate_calls=True)
    for _ in range(20):
        model[0](x).sum().backward()
    got = mon.stats()
    mon.remove()
    assert set(got) == {"0:output@0", "0:grad_output@0", "0:grad_input@0"}
    assert got["0:output@0"]["count"] == 20 * 3 * 4


def test_input_gradients_of_a_module_whose_output_nests_its_tensors():
    """An LSTM returns (out, (h, c)); a loss on h alone still gives the gradient w.r.t. the input."""
    torch.manual_seed(0)
    lstm, head = nn.LSTM(4, 6, batch_first=True), nn.Linear(6, 1)
    x = torch.randn(2, 5, 4, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and no PyTorch warning about hooks firing without input gradients
        mon = hookstats.attach(lstm, input_grads=True)
        _, (h, _) = lstm(x)
        head(h[-1]).sum().backward()
        got = mon.stats(kind="grad_input")
        mon.remove()
    _, (h, _) = lstm(x)
    (want,) = torch.autograd.grad(head(h[-1]).sum(), x)
    assert_matches(got["LSTM:grad_input"], want, mon.cfg)


def test_an_input_slot_keeps_its_name_however_a_call_passes_it():
    torch.manual_seed(0)
    gru = nn.GRU(4, 6, batch_first=True)
    x = torch.randn(2, 3, 4, requires_grad=True)
    h0 = torch.randn(1, 2, 6, requires_grad=True)
    mon = hookstats.attach(gru, inputs=True, input_grads=True)
    o1, h = gru(x)
    o2, _ = gru(x, h0)  # hx passed positionally
    o3, _ = gru(x, hx=h0)  # and by keyword
    (o1.sum() + o2.sum() + o3.sum()).backward()
    got = mon.stats()
    mon.remove()
    assert {k for k in got if ":input" in k or ":grad_input" in k} == {"GRU:input", "GRU:input['hx']", "GRU:grad_input",
                                                                         "GRU:grad_input['hx']"}
    assert_matches(got["GRU:input"], cat([x, x, x]), mon.cfg)
    assert_matches(got["GRU:input['hx']"], cat([h0, h0]), mon.cfg)
    # h0 passed by keyword is not a positional input: its gradient is not a grad_input (as in PyTorch)
    assert got["GRU:grad_input"]["count"] == 3 * x.numel() and got["GRU:grad_input['hx']"]["count"] == h0.numel()


class Flaky(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.fail = False

    def forward(self, x):
        y = self.lin(x)
        if self.fail:
            raise RuntimeError("boom")
        return self.lin(y)


def test_a_forward_that_raises_does_not_shift_the_calls_of_later_steps():
    model, ref = twins(Flaky)
    x = torch.randn(3, 4, requires_grad=True)
    mon = hookstats.attach(model, input_grads=True, separate_calls=True)
    model.fail = True
    with pytest.raises(RuntimeError, match="boom"):
        model(x)
    model.fail = False
    mon.reset()
    model(x).square().sum().backward()
    got = mon.stats(kind="grad_input")
    mon.remove()
    inputs = []
    h = ref.lin.register_forward_hook(lambda m, a, o: inputs.append(a[0]))
    gi = torch.autograd.grad(ref(x).square().sum(), inputs)
    h.remove()
    assert set(got) == {"lin:grad_input@0", "lin:grad_input@1"}
    for k in (0, 1):
        assert_matches(got[f"lin:grad_input@{k}"], gi[k], mon.cfg)


@dataclasses.dataclass
class Out:
    logits: torch.Tensor
    aux: tuple
    ids: torch.Tensor = None


class Containers(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x):
        y, z = self.a(x), self.b(x)
        return Out(y, (z * 2, {"z": torch.sigmoid(z), "none": None}), y.argmax(-1))


def test_dataclass_tuple_dict_outputs_name_each_float_leaf_for_values_and_gradients():
    model = Containers()
    head = nn.Sequential(model)
    with hookstats.attach(head, modules=["0"]) as mon:
        o = head(torch.randn(5, 4))
        (o.logits.sum() + o.aux[0].square().sum() + o.aux[1]["z"].sum()).backward()
    got = mon.stats()
    leaves = {".logits", ".aux[0]", ".aux[1]['z']"}
    assert set(got) == {f"0:{k}{leaf}" for k in ("output", "grad_output") for leaf in leaves}
    cfg = mon.cfg
    assert_matches(got["0:grad_output.logits"], torch.ones(5, 4), cfg)
    assert_matches(got["0:grad_output.aux[0]"], 2 * o.aux[0].detach(), cfg)
    assert_matches(got["0:output.aux[1]['z']"], o.aux[1]["z"], cfg)
    assert_matches(got["0:grad_output.aux[1]['z']"], torch.ones(5, 4), cfg)


def test_hf_model_output_leaves():
    from transformers.modeling_outputs import BaseModelOutput

    class Enc(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            h = self.lin(x)
            return BaseModelOutput(last_hidden_state=h, hidden_states=(x, h))

    model = Enc()
    x = torch.randn(3, 4)
    with hookstats.attach(model, modules=[""]) as mon:
        out = model(x)
        out.last_hidden_state.sum().backward()
    got = mon.stats()
    assert {"Enc:output['last_hidden_state']", "Enc:output['hidden_states'][0]", "Enc:output['hidden_states'][1]",
            "Enc:grad_output['last_hidden_state']"} <= set(got)
    assert_matches(got["Enc:grad_output['last_hidden_state']"], torch.ones(3, 4), mon.cfg)


class Watched(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(8, 8)
        self.mon = None

    def forward(self, x):
        scores = self.q(x) @ x.transpose(-1, -2) / 8 ** 0.5
        if self.mon is not None:
            scores = self.mon.watch("attn_scores", scores)
        return torch.softmax(scores, -1) @ x


def test_watch_measures_a_tensor_and_its_gradient():
    model, ref = twins(Watched)
    x = torch.randn(2, 6, 8)
    mon = hookstats.attach(model, outputs=False, grads=False)
    model.mon = mon
    for _ in range(2):
        model(x).square().sum().backward()
    mon.remove()
    seen = []
    ref.mon = type("Spy", (), {"watch": lambda self, n, t: seen.append(t) or t})()
    ys = [ref(x).square().sum() for _ in range(2)]
    gs = [torch.autograd.grad(y, s)[0] for y, s in zip(ys, seen)]
    got = mon.stats()
    assert set(got) == {"attn_scores:watch", "attn_scores:watch_grad"}
    assert_matches(got["attn_scores:watch"], cat(seen), mon.cfg)
    assert_matches(got["attn_scores:watch_grad"], cat(gs), mon.cfg)
    model(x)  # after remove(): watch is a no-op that returns the tensor
    assert mon.stats()["attn_scores:watch"]["count"] == 2 * 2 * 6 * 6


def test_watch_rejects_bad_input_clearly():
    mon = hookstats.attach(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="name"):
        mon.watch("", torch.ones(2))
    with pytest.raises(ValueError, match="float32/float64/float16/bfloat16 tensor, got torch.int64"):
        mon.watch("ids", torch.arange(3))
    with pytest.raises(ValueError, match="got list"):
        mon.watch("x", [1.0])
    mon.remove()


class Odd(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))

    def forward(self, x, mask=None, scale=1.0):
        y = x * self.w * scale
        return y, y.to(torch.float8_e4m3fn), y.to_sparse(), mask


def test_keyword_inputs_are_measured_and_unsupported_tensors_are_skipped():
    model = Odd()
    x, mask = torch.randn(3, 4), torch.rand(3, 4)
    with hookstats.attach(model, inputs=True) as mon:
        y = model(x, mask=mask, scale=2.0)[0]
        y.sum().backward()
    got = mon.stats()
    assert set(got) == {"Odd:input", "Odd:input['mask']", "Odd:output[0]", "Odd:grad_output[0]", "Odd:output[3]"}
    assert_matches(got["Odd:input['mask']"], mask, mon.cfg)
    assert_matches(got["Odd:output[3]"], mask, mon.cfg)
    assert_matches(got["Odd:grad_output[0]"], torch.ones(3, 4), mon.cfg)


def test_param_grads_once_per_optimizer_step_with_gradient_accumulation_and_frozen_params():
    model, ref = twins(mlp)
    model[2].weight.requires_grad_(False)
    ref[2].weight.requires_grad_(False)
    xs = [torch.randn(8, 8) for _ in range(3)]
    mon = hookstats.attach(model, param_grads=True, steps="manual")
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    for _ in range(2):
        for x in xs:  # three micro-batches, one optimizer step
            model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        mon.step()
    mon.remove()
    ropt = torch.optim.SGD([p for p in ref.parameters() if p.requires_grad], lr=0.1)
    want = {}
    for _ in range(2):
        for x in xs:
            ref(x).square().mean().backward()
        for n, p in ref.named_parameters():
            if p.grad is not None:
                want.setdefault(n, []).append(p.grad.clone())
        ropt.step()
        ropt.zero_grad()
    got = mon.stats(kind="param_grad")
    assert set(got) == {f"{n}:param_grad" for n in want}
    assert "2.weight:param_grad" not in got  # frozen: no hook, no state
    for n, gs in want.items():
        assert_matches(got[f"{n}:param_grad"], cat(gs), mon.cfg)


def test_param_grads_without_an_optimizer_are_measured_at_step():
    model = nn.Linear(4, 2)
    mon = hookstats.attach(model, param_grads=True, steps="manual")
    x = torch.randn(3, 4)
    model(x).sum().backward()
    model(x).sum().backward()
    want = model.weight.grad.clone()
    mon.step()
    model.zero_grad()
    mon.remove()
    assert_matches(mon.stats()["Linear.weight:param_grad"], want, mon.cfg)


@pytest.mark.parametrize("micro_batches", [1, 3])
def test_param_grads_of_a_hand_written_update_that_drops_them_before_mon_step(micro_batches):
    # p -= lr * p.grad; p.grad = None, then mon.step(): the gradients were gone when mon.step() came to read them
    model, ref = twins(mlp)
    xs = [torch.randn(8, 8) for _ in range(micro_batches)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mon = hookstats.attach(model, param_grads=True, steps="manual")
        for _ in range(2):
            for x in xs:
                model(x).square().mean().backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.1 * p.grad
                    p.grad = None
            mon.step()
        got = mon.stats(kind="param_grad")
        mon.remove()
    want = {}
    for _ in range(2):
        for x in xs:
            ref(x).square().mean().backward()
        with torch.no_grad():
            for n, p in ref.named_parameters():
                want.setdefault(n, []).append(p.grad.clone())
                p -= 0.1 * p.grad
                p.grad = None
    assert set(got) == {f"{n}:param_grad" for n in want}
    for n, gs in want.items():
        assert_matches(got[f"{n}:param_grad"], cat(gs), mon.cfg)


def test_param_grads_zeroed_in_place_before_mon_step_are_said_once():
    model = nn.Linear(4, 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mon = hookstats.attach(model, param_grads=True, steps="manual")
        for _ in range(3):
            model(torch.randn(3, 4)).sum().backward()
            model.zero_grad(set_to_none=False)
            mon.step()
        mon.remove()
    said = [w for w in caught if "changed in place between their backward and mon.step()" in str(w.message)]
    assert len(said) == 1 and said[0].filename == __file__, [str(w.message) for w in caught]


def test_param_grads_clipped_before_an_optimizer_step_are_measured_clipped_in_silence():
    model, ref = twins(mlp)
    x = torch.randn(8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mon = hookstats.attach(model, param_grads=True)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(x).square().mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
        opt.step()
        got = mon.stats(kind="param_grad")
        mon.remove()
    ref(x).square().mean().backward()
    torch.nn.utils.clip_grad_norm_(ref.parameters(), 1e-3)
    for n, p in ref.named_parameters():
        assert_matches(got[f"{n}:param_grad"], p.grad, mon.cfg)


def test_param_grads_follow_every_n():
    model = nn.Linear(4, 2)
    mon = hookstats.attach(model, param_grads=True, every=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):  # steps 0, 2, 4 measured
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    mon.remove()
    assert mon.stats()["Linear.weight:param_grad"]["count"] == 3 * 8


class Checkpointed(nn.Module):
    def __init__(self, reentrant):
        super().__init__()
        self.reentrant = reentrant
        self.inner = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8))
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        if self.reentrant is None:
            return self.head(self.inner(x))
        return self.head(checkpoint(self.inner, x, use_reentrant=self.reentrant))


@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_activation_checkpointing_is_not_counted_twice(reentrant):
    torch.manual_seed(0)
    plain = Checkpointed(None)
    ckpt = Checkpointed(reentrant)
    ckpt.load_state_dict(plain.state_dict())
    x = torch.randn(16, 8, requires_grad=True)
    kw = dict(inputs=True, param_grads=True)
    a = run(plain, x, lambda y: y.square().sum(), steps=2, **kw).stats()
    b = run(ckpt, x, lambda y: y.square().sum(), steps=2, **kw).stats()
    assert set(a) == set(b) and len(a) >= 15
    for tid, rec in a.items():
        assert b[tid]["count"] == rec["count"], tid
        np.testing.assert_array_equal(b[tid]["hist"], rec["hist"])
        np.testing.assert_array_equal(b[tid]["float_hist"], rec["float_hist"])  # the default histogram
        assert b[tid]["mean"] == pytest.approx(rec["mean"], rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_checkpointing_with_separate_calls_never_misattributes_gradients(reentrant, recwarn):
    torch.manual_seed(0)
    plain = Checkpointed(None)
    ckpt = Checkpointed(reentrant)
    ckpt.load_state_dict(plain.state_dict())
    x = torch.randn(16, 8, requires_grad=True)
    a = run(plain, x, lambda y: y.square().sum(), steps=2, separate_calls=True, input_grads=True).stats()
    b = run(ckpt, x, lambda y: y.square().sum(), steps=2, separate_calls=True, input_grads=True).stats()
    told = [w for w in recwarn if "recomputed by activation checkpointing" in str(w.message)]
    assert "inner.0:output@0" in b and not any(t.endswith("@1") for t in b)  # no phantom second call
    for tid, rec in b.items():  # whatever is measured equals the plain model's numbers
        assert rec["count"] == a[tid]["count"], tid
        np.testing.assert_array_equal(rec["hist"], a[tid]["hist"])
        np.testing.assert_array_equal(rec["float_hist"], a[tid]["float_hist"])  # the default histogram
    if reentrant:  # its gradients exist only in the recomputed graph: left out, and said once
        assert "inner.0:grad_output@0" not in b and "inner.0:grad_input@0" not in b and len(told) == 1
        assert "head:grad_input@0" in b
    else:
        assert set(b) == set(a) and not told


def test_a_no_grad_forward_earlier_does_not_make_later_checkpointing_warn(recwarn):
    torch.manual_seed(0)
    model = Checkpointed(False)
    x = torch.randn(16, 8, requires_grad=True)
    mon = hookstats.attach(model, separate_calls=True)
    with torch.no_grad():
        model(x)  # a train-mode forward without grad (a probe, a metric)
    model(x).sum().backward()  # non-reentrant checkpointing: every gradient is measured
    mon.remove()
    assert not [w for w in recwarn if "recomputed by activation checkpointing" in str(w.message)]
    assert mon.stats()["inner.0:grad_output@0"]["count"] == 16 * 8


def test_training_with_every_target_is_bit_exact():
    """Hooks never change what they observe: identical parameters after training with and without them."""
    def train(model, hooked):
        mon = hookstats.attach(model, include_paramless=True, **ALL) if hooked else None
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        torch.manual_seed(1)
        for _ in range(4):
            x = torch.randn(4, 3, 6, 6)
            loss = F.cross_entropy(model(x), torch.arange(4))
            loss.backward()
            opt.step()
            opt.zero_grad()
        if mon is not None:
            assert mon.stats()["0:grad_output"]["count"] > 0
            mon.remove()
        return [p.detach().clone() for p in model.parameters()]

    model, ref = twins(cnn)
    for p, q in zip(train(model, True), train(ref, False)):
        assert torch.equal(p, q)


def test_eval_forwards_are_apart_and_grads_follow_their_phase():
    model = mlp()
    x = torch.randn(4, 8)
    with hookstats.attach(model, eval=True) as mon:
        model(x).sum().backward()
        model.eval()
        model(x).sum().backward()  # e.g. saliency in eval mode
        with torch.no_grad():
            model(x)
    train, ev = mon.stats(), mon.stats(phase="eval")
    assert train["0:grad_output"]["count"] == 64
    assert ev["0:grad_output"]["count"] == 64 and ev["0:output"]["count"] == 128


def test_pause_resume_and_reset_cover_gradients():
    model = mlp()
    x = torch.randn(4, 8)
    mon = hookstats.attach(model, param_grads=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    for paused in (False, True, False):
        (mon.pause if paused else mon.resume)()
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
    got = mon.stats()
    assert got["0:grad_output"]["count"] == 2 * 64 and got["0.weight:param_grad"]["count"] == 2 * 128
    mon.reset()
    assert mon.stats()["0:grad_output"]["count"] == 0
    mon.remove()


def test_pause_between_forward_and_backward_lists_no_empty_gradient_target():
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 1))
    mon = hookstats.attach(model, modules=["2"])
    y = model(torch.randn(3, 8))
    mon.pause()
    y.sum().backward()
    got = mon.stats()
    mon.remove()
    assert set(got) == {"2:output"} and got["2:output"]["count"] == 3


def all_hooks(model):
    n = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
            + len(m._backward_pre_hooks) for m in model.modules())
    return n + sum(len(p._post_accumulate_grad_hooks or {}) for p in model.parameters())


def test_remove_leaves_zero_hooks_of_any_kind():
    from torch.optim.optimizer import _global_optimizer_pre_hooks
    model = cnn()
    before = len(_global_optimizer_pre_hooks)
    mon = hookstats.attach(model, include_paramless=True, **ALL)
    assert all_hooks(model) > 0 and len(_global_optimizer_pre_hooks) == before + 1
    model(torch.randn(2, 3, 6, 6)).sum().backward()
    mon.remove()
    mon.remove()
    assert all_hooks(model) == 0 and len(_global_optimizer_pre_hooks) == before


@pytest.mark.parametrize("backend, separate_calls", [("compiled", False), ("reference", False), ("compiled", True)])
def test_backward_and_optimizer_step_run_without_host_sync(backend, separate_calls):
    from hookstats.tools.bench import reference_backend
    model = cnn()
    x = torch.randn(4, 3, 6, 6, requires_grad=separate_calls)  # and the first layer's input gradient
    with reference_backend() if backend == "reference" else contextlib.nullcontext():
        mon = hookstats.attach(model, separate_calls=separate_calls, **ALL)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(x).sum().backward()  # first step allocates lazily created states
        opt.step()
        opt.zero_grad()
        with no_host_sync() as ops:
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
        counts = {k: v["count"] for k, v in mon.stats().items()}
        mon.remove()
    call = "@0" if separate_calls else ""
    assert counts[f"0:grad_output{call}"] == counts[f"0:output{call}"] > 0 and counts["0.weight:param_grad"] > 0
    assert counts[f"3:grad_input{call}"] > 0 and (f"0:grad_input{call}" in counts) == separate_calls
    if backend == "compiled":
        assert sum("hookstats.accumulate_many_" in o for o in ops) == 1
        assert sum("hookstats.accumulate_." in o for o in ops) >= 3 * 4  # outputs, inputs, grads...
    else:
        assert not any("hookstats" in o for o in ops) and len(ops) > 100


def test_the_host_sync_guard_sees_backward():
    x = torch.randn(3, requires_grad=True)
    y = x * 2
    y.register_hook(lambda g: g.sum().item() and None)
    with pytest.raises(HostSyncError):
        with no_host_sync():
            y.sum().backward()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="model parallel needs a second device (CUDA)")
def test_model_parallel_keeps_each_target_on_its_own_device(monkeypatch):
    from hookstats import accumulate, reference
    if not accumulate.has_cuda_kernel():
        monkeypatch.setattr(accumulate, "accumulate_", reference.accumulate_)
        monkeypatch.setattr(accumulate, "accumulate_many_", reference.accumulate_many_)

    class Split(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(8, 8)
            self.b = nn.Linear(8, 2).cuda()

        def forward(self, x):
            return self.b(torch.relu(self.a(x)).cuda())

    model, ref = twins(Split)
    x = torch.randn(4, 8)
    mon = run(model, x, lambda y: y.square().sum(), param_grads=True)
    devices = {key.module: dev.type for key, dev, _ in mon.states()}
    assert devices["a"] == "cpu" and devices["b"] == "cuda" and devices["b.weight"] == "cuda"
    want = capture(ref, x, lambda y: y.square().sum(), ["a", "b"])
    for tid, rec in mon.stats().items():
        assert_matches(rec, want[tid].cpu(), mon.cfg)


def test_input_grads_measure_modules_an_in_place_module_follows():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 8)), nn.ReLU(inplace=True), nn.Linear(8, 2),
                          nn.ReLU(inplace=False))
    mon = hookstats.attach(model, input_grads=True)
    x = torch.randn(3, 4)
    model(x).sum().backward()  # raised "BackwardHookFunctionBackward is a view and is being modified inplace" once
    mon.remove()
    got = mon.stats(kind="grad_input")
    assert set(got) == {"0.1:grad_input", "2:grad_input"}  # 0.0's input does not require grad
    assert got["2:grad_input"]["count"] == got["0.1:grad_input"]["count"] == 3 * 8


@pytest.mark.parametrize("separate_calls", [False, True], ids=["merged", "separate_calls"])
def test_input_grads_leave_out_calls_that_modify_their_input_in_place(separate_calls):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.ReLU(inplace=True), nn.Dropout(0.1)), nn.Linear(4, 4),
                          nn.ReLU(inplace=True), nn.Linear(4, 1))
    mon = hookstats.attach(model, input_grads=True, include_paramless=True, separate_calls=separate_calls)
    call = "@0" if separate_calls else ""
    with pytest.warns(RuntimeWarning, match="modifies its input in place") as record:
        model(torch.randn(3, 4, requires_grad=True)).sum().backward()  # raised before: in-place on a hooked view
    said = " ".join(str(w.message) for w in record)
    assert all(f"{n}:grad_input{call} is not measured" in said for n in ("1", "1.0", "3"))
    mon.remove()
    assert set(mon.stats(kind="grad_input")) == {f"{n}:grad_input{call}" for n in ("Sequential", "0", "1.1", "2", "4")}


def _fsdp2_worker(rank, world, store, out):
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    torch.set_num_threads(1)
    # a file store: no TCP port to race for with other jobs between picking it and binding it
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = mlp()
        for m in (model[0], model[2], model[4], model):
            fully_shard(m)
        mon = hookstats.attach(model, param_grads=True, hist_every=1)  # a spawned process: no module fixture
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.manual_seed(1)
        for _ in range(2):  # the same batch on every rank: the averaged gradient is the local one
            model(torch.randn(4, 8)).square().mean().backward()
            opt.step()
            opt.zero_grad()
        reduced = mon.reduce().stats(kind="param_grad")
        if rank == 0:
            torch.save(reduced, out)
    finally:
        dist.destroy_process_group()
    exit_without_finalizing()


def test_param_grads_of_fsdp2_sharded_parameters(tmp_path):
    import torch.multiprocessing as mp
    mp.spawn(_fsdp2_worker, args=(2, tmp_path / "store", tmp_path / "r.pt"), nprocs=2)
    got = torch.load(tmp_path / "r.pt", weights_only=False)
    torch.manual_seed(0)
    ref = mlp()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    torch.manual_seed(1)
    want = {}
    for _ in range(2):
        ref(torch.randn(4, 8)).square().mean().backward()
        for n, p in ref.named_parameters():
            want.setdefault(n, []).append(p.grad.clone())
        opt.step()
        opt.zero_grad()
    assert set(got) == {f"{n}:param_grad" for n in want}
    for n, gs in want.items():
        rec = got[f"{n}:param_grad"]
        exp = finalize(*oracle(cat(gs), hookstats.StatsConfig()), hookstats.StatsConfig())
        assert rec["count"] == exp["count"]
        np.testing.assert_array_equal(rec["hist"], exp["hist"])
        np.testing.assert_array_equal(rec["float_hist"], exp["float_hist"])  # the default histogram
        assert rec["mean"] == pytest.approx(exp["mean"], rel=1e-5, abs=1e-6 * exp["std"])


def test_a_model_attached_on_the_meta_device_then_materialized():
    with torch.device("meta"):
        model = mlp()
    with pytest.raises(ValueError, match="meta device"):
        hookstats.attach(model, param_grads=True)
    assert all_hooks(model) == 0
    mon = hookstats.attach(model, inputs=True)
    model.to_empty(device="cpu")
    for p in model.parameters():
        nn.init.normal_(p)
    x = torch.randn(4, 8)
    loss = model(x).sum()
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    got = mon.stats()
    assert got["0:output"]["count"] == got["0:grad_output"]["count"] == 2 * got["0:input"]["count"] == 64
    assert all(dev.type == "cpu" for _, dev, _ in mon.states())
    mon.remove()


def test_a_forgotten_monitor_does_not_keep_its_model_alive():
    import gc
    import weakref
    from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks
    gc.collect()
    hookstats.attach(nn.Linear(2, 2), param_grads=True).remove()  # drops dead hooks earlier tests left behind
    before = len(_global_optimizer_pre_hooks), len(_global_optimizer_post_hooks)
    model = mlp()
    hookstats.attach(model, param_grads=True)  # never removed
    alive = weakref.ref(model)
    del model
    gc.collect()
    assert alive() is None
    other = nn.Linear(2, 2)
    other(torch.randn(3, 2)).sum().backward()
    torch.optim.SGD(other.parameters(), lr=0.1).step()  # the dead monitor's global hooks do nothing
    hookstats.attach(other, param_grads=True).remove()  # and are removed at the next registration
    assert (len(_global_optimizer_pre_hooks), len(_global_optimizer_post_hooks)) == before


@pytest.mark.parametrize("every", [2, 3])
def test_accumulation_whose_optimizer_steps_are_never_sampled_says_so(every):
    # 2 forwards per optimizer step and every=2: each optimizer step falls on an unsampled step, so no
    # parameter gradient is ever measured; that used to pass in silence
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mon = hookstats.attach(model, every=every, param_grads=True)
        for _ in range(6):
            for _ in range(2):
                model(torch.randn(3, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
        got = mon.stats(kind="param_grad")
        mon.remove()
    said = [w for w in caught if "param_grads=True has measured nothing" in str(w.message)]
    if every == 2:
        assert got == {} and len(said) == 1 and said[0].filename == __file__
    else:
        assert said == [] and got["0.weight:param_grad"]["count"] > 0


@pytest.mark.parametrize("forwards", [1, 2])
def test_gradients_arriving_in_a_later_step_than_their_forward_are_said_once(forwards):
    # two train forwards before one backward (two views of a batch): the first view's gradients reached
    # the next step, and with every=2 no gradient was measured at all, in silence
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mon = hookstats.attach(model, every=2)
        for _ in range(3):
            sum(model(torch.randn(3, 4)).sum() for _ in range(forwards)).backward()
        mon.remove()
    said = [w for w in caught if "arrived in step" in str(w.message)]
    assert len(said) == (forwards - 1) and all(w.filename == __file__ for w in said)


@pytest.mark.parametrize("update", ["by_hand", "torch_optim", "mon_step"])
def test_parameter_gradients_nothing_came_to_measure_are_said_once(update):
    # a hand-written update (no torch.optim optimizer) without mon.step() measured nothing, in silence
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mon = hookstats.attach(model, param_grads=True)
        model(torch.randn(3, 4)).sum().backward()
        mon.stats()  # mid-step, before the first update: nothing to say yet
        for _ in range(3):
            if update == "by_hand":
                with torch.no_grad():
                    for p in model.parameters():
                        p -= 0.1 * p.grad
                        p.grad = None
            elif update == "torch_optim":
                opt.step()
                opt.zero_grad()
            else:
                mon.step()
            model(torch.randn(3, 4)).sum().backward()
        got = mon.stats(kind="param_grad")
        mon.remove()
    said = [w for w in caught if "has measured no parameter gradient" in str(w.message)]
    if update == "by_hand":
        assert got == {} and len(said) == 1 and said[0].filename == __file__
    else:
        assert said == [] and got["0.weight:param_grad"]["count"] == 3 * 32
