"""The op called directly with a tensor kind it does not read (sparse, quantized, nested, MKL-DNN): one clear
error, on both backends, saying which tensor kinds it takes, for x and for any state; no state changes."""
import warnings

import pytest
import torch

from hookstats import StatsConfig, accumulate, rawstate, reference

CFG = StatsConfig(linear_hist=True, float_hist=False)
ON = torch.tensor([True])


def fresh():
    return (*rawstate.empty(CFG.istate_size), torch.zeros(0, dtype=torch.uint8))


def kinds():
    warnings.filterwarnings("ignore", message=".*(quantized tensor creation|nested tensors is in prototype).*")
    x = torch.randn(4, 6)
    out = {
        "sparse_coo": (x.to_sparse(), "sparse"),
        "sparse_csr": (x.to_sparse_csr(), "sparse"),
        "sparse_csc": (x.to_sparse_csc(), "sparse"),
        "quantized": (torch.quantize_per_tensor(x, 0.1, 0, torch.qint8), "quantized"),
        "nested_strided": (torch.nested.nested_tensor([torch.randn(3), torch.randn(5)]), "nested"),
        "nested_jagged": (torch.nested.nested_tensor([torch.randn(3, 2), torch.randn(5, 2)], layout=torch.jagged),
                          "nested"),
    }
    if torch.backends.mkldnn.is_available():
        out["mkldnn"] = (x.to_mkldnn(), "mkldnn")
    return out


KINDS = kinds()
OPS = {"reference": (reference.accumulate_, reference.accumulate_many_)}
if accumulate.backend() == "compiled":
    OPS["compiled"] = (torch.ops.hookstats.accumulate_.default, torch.ops.hookstats.accumulate_many_.default)


def assert_clear(err, what, kind):
    msg = str(err)
    assert "Could not run" not in msg and "backend" not in msg.split("dense")[0], msg
    assert f"{what} is a {kind}" in msg, msg
    for words in ("dense", "strided", "float32, float64, float16 or bfloat16", "CPU or CUDA"):
        assert words in msg, (words, msg)


@pytest.mark.parametrize("backend", list(OPS))
@pytest.mark.parametrize("kind", list(KINDS))
def test_x_of_an_unread_kind_is_one_clear_error(backend, kind):
    one, many = OPS[backend]
    x, word = KINDS[kind]
    f, i, s = fresh()
    before = f.clone(), i.clone()
    with pytest.raises(RuntimeError) as e:
        one(x, f, i, s, ON, CFG.op_params())
    assert_clear(e.value, "x", word)
    dense = torch.randn(8)
    with pytest.raises(RuntimeError) as e:
        many([dense, x], [f, f.clone()], [i, i.clone()], [s, s.clone()], ON, CFG.op_params())
    assert_clear(e.value, "target[1]: x", word)
    assert torch.equal(f[:3], before[0][:3]) and torch.equal(i, before[1])  # nothing measured


@pytest.mark.parametrize("backend", list(OPS))
@pytest.mark.parametrize("state", ["fstate", "istate"])
def test_a_sparse_state_is_one_clear_error(backend, state):
    one, _ = OPS[backend]
    f, i, s = fresh()
    args = {"fstate": f, "istate": i}
    args[state] = args[state].to_sparse()
    with pytest.raises(RuntimeError) as e:
        one(torch.randn(5), args["fstate"], args["istate"], s, ON, CFG.op_params())
    assert_clear(e.value, state, "sparse")


@pytest.mark.parametrize("backend", list(OPS))
def test_dense_views_of_those_kinds_are_read(backend):
    """What the message advises works: to_dense(), dequantize(), values()."""
    one, _ = OPS[backend]
    for x, _ in KINDS.values():
        dense = (x.dequantize() if x.is_quantized else x.values() if x.is_nested
                 else x.to_dense())
        f, i, s = fresh()
        one(dense, f, i, s, ON, CFG.op_params())
        assert i[0].item() == dense.numel() or f[0].item() == dense.numel() or i.sum().item() >= dense.numel()
