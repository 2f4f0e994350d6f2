"""Tensors the op cannot take as they are never stop the forward: nested tensors are measured through their
values, sparse tensors and tensor subclasses hookstats cannot read are named in a warning, integer,
complex, quantized and meta tensors are skipped."""
import warnings

import numpy as np
import pytest
import torch
from helpers import oracle
from torch import nn
from torch.testing._internal.two_tensor import TwoTensor

import hookstats
from hookstats.records import finalize

pytestmark = pytest.mark.usefixtures("every_step_histograms")  # their oracles count every step's histograms


def assert_matches(rec, values, cfg):
    want = finalize(*oracle(values.detach().double().reshape(-1), cfg), cfg)
    assert rec["count"] == want["count"] == values.numel()
    np.testing.assert_array_equal(rec["hist"], want["hist"])
    np.testing.assert_array_equal(rec["float_hist"], want["float_hist"])  # the default histogram
    assert rec["mean"] == pytest.approx(want["mean"], rel=1e-6, abs=1e-7)
    assert (rec["min"], rec["max"]) == pytest.approx((want["min"], want["max"]), rel=1e-6)


def test_transformer_encoder_eval_fast_path_nested_tensors_are_measured_by_their_values():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, dropout=0.0)
    enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()
    x = torch.randn(3, 5, 8)
    mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] + [True] * 4])
    seen = {}  # the test's own hooks: each nested output as its real tokens
    handles = [m.register_forward_hook(lambda m, a, out, n=n: seen.setdefault(n, []).append(
        torch.cat([c.reshape(-1) for c in out.unbind()]) if out.is_nested else out.reshape(-1)))
        for n, m in enc.named_modules() if n in ("layers.0", "layers.1.linear1")]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors")
        want_out = enc(x, src_key_padding_mask=mask)
        for h in handles:
            h.remove()
        mon = hookstats.attach(enc, eval=True, include_paramless=True, inputs=True)
        got_out = enc(x, src_key_padding_mask=mask)
    mon.remove()
    torch.testing.assert_close(got_out, want_out, rtol=0, atol=0)
    got = mon.stats(phase="eval")
    assert seen["layers.0"][0].numel() == (5 + 3 + 1) * 8  # nested: the padded tokens are not there
    assert_matches(got["layers.0:output"], seen["layers.0"][0], mon.cfg)
    assert_matches(got["layers.1.linear1:output"], seen["layers.1.linear1"][0], mon.cfg)


class Odd(nn.Module):
    """Returns one tensor of each kind the op cannot take as it is, and a plain one."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        q = torch.quantize_per_tensor(y.detach(), 0.1, 0, torch.qint8)
        jagged = torch.nested.nested_tensor([y[0], y[1, :2]], layout=torch.jagged)
        return {"plain": y, "sparse": y.to_sparse(), "two": TwoTensor(y, y * 2), "complex": y.to(torch.complex64),
                "quantized": q, "meta": torch.empty(3, device="meta"), "jagged": jagged, "int": y.argmax(-1)}


def test_odd_tensors_never_stop_the_forward_and_unread_ones_are_named_once():
    torch.manual_seed(0)
    model = Odd()
    x = torch.randn(2, 3, 4)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with hookstats.attach(model, modules=["", "lin"]) as mon:
            for _ in range(2):
                out = model(x)
                out["plain"].sum().backward()
    said = [str(w.message) for w in record if "hookstats" in str(w.message)]
    assert sorted(said) == [
        "hookstats: Odd:grad_output['sparse'] is not measured: its tensor is a torch.sparse_coo tensor",
        "hookstats: Odd:grad_output['two'] is not measured: its tensor is a TwoTensor, a tensor subclass whose data "
        "hookstats cannot read",
        "hookstats: Odd:output['sparse'] is a torch.sparse_coo tensor: it is not measured",
        "hookstats: Odd:output['two'] is a TwoTensor, a tensor subclass whose data hookstats cannot read: it is not "
        "measured"]
    got = mon.stats()
    assert set(got) == {"lin:output", "lin:grad_output", "Odd:output['plain']", "Odd:output['jagged']",
                        "Odd:grad_output['plain']"}
    assert_matches(got["Odd:output['plain']"], torch.cat([out["plain"]] * 2), mon.cfg)
    assert_matches(got["Odd:output['jagged']"], torch.cat([out["jagged"].values()] * 2), mon.cfg)
    assert_matches(got["Odd:grad_output['plain']"], torch.ones(2 * 2 * 3 * 4), mon.cfg)


def test_a_sparse_parameter_gradient_is_named_once_not_dropped_in_silence():
    """nn.Embedding(sparse=True) gives its weight a sparse COO gradient, which the op does not read: with
    param_grads=True that target is named in one warning (its dense neighbours are measured)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(20, 4, sparse=True), nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with hookstats.attach(model, param_grads=True) as mon:
            for _ in range(3):
                model(torch.randint(0, 20, (3, 5))).square().mean().backward()
                assert model[0].weight.grad.is_sparse
                opt.step()
                opt.zero_grad()
            got = mon.stats(kind="param_grad")
    said = [str(w.message) for w in caught if "0.weight:param_grad" in str(w.message)]
    assert said == ["hookstats: 0.weight:param_grad is not measured: its gradient is a torch.sparse_coo tensor"]
    assert sorted(got) == ["1.bias:param_grad", "1.weight:param_grad"] and got["1.weight:param_grad"]["count"] == 3 * 8
