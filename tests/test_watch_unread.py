"""mon.watch of a floating tensor whose values the op cannot read (sparse, meta) warns once, naming the target and
why, and skips it; the torch and Paddle front ends alike. A tensor of another dtype stays a ValueError."""
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import hookstats


class Watched(nn.Module):
    def __init__(self, make):
        super().__init__()
        self.fc, self.make, self.mon = nn.Linear(3, 3), make, None

    def forward(self, x):
        y = self.fc(x)
        self.mon.watch("odd", self.make(y))
        self.mon.watch("dense", y)
        return y


def _run(model, x, backward, calls=3):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(calls):
            backward(model(x))
    return [str(w.message) for w in caught if "odd:watch" in str(w.message)]


TORCH_CASES = {
    "sparse COO": (lambda y: y.detach().to_sparse(), "sparse_coo"),
    "sparse CSR": (lambda y: y.detach().to_sparse_csr(), "sparse_csr"),
    "meta": (lambda y: torch.empty(y.shape, device="meta"), "meta tensor"),
}


@pytest.mark.parametrize("case", list(TORCH_CASES))
def test_torch_watch_of_an_unreadable_tensor_warns_once_and_skips_it(case):
    make, why = TORCH_CASES[case]
    model = Watched(make)
    x = torch.randn(4, 3)
    with hookstats.attach(model) as mon:
        model.mon = mon
        said = _run(model, x, lambda y: y.sum().backward())
        stats = mon.stats()
    assert len(said) == 1 and why in said[0] and "not measured" in said[0] and "\n" not in said[0], said
    assert "odd:watch" not in stats and "odd:watch_grad" not in stats
    # the dense tensor beside it is measured as usual: 3 forwards of a [4, 3] output
    y = model.fc(x).detach().double().numpy()
    np.testing.assert_allclose(stats["dense:watch"]["mean"], y.mean(), rtol=1e-6)
    assert stats["dense:watch"]["count"] == 3 * y.size


def test_torch_watch_of_a_non_float_tensor_is_still_an_error():
    model = Watched(lambda y: torch.arange(3))
    with hookstats.attach(model) as mon:
        model.mon = mon
        with pytest.raises(ValueError, match="float32/float64/float16/bfloat16 tensor, got torch.int64"):
            model(torch.randn(4, 3))


def test_paddle_watch_of_a_sparse_tensor_warns_once_and_skips_it_as_torch():
    paddle = pytest.importorskip("paddle")

    class PWatched(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.fc, self.mon = paddle.nn.Linear(3, 3), None

        def forward(self, x):
            y = self.fc(x)
            self.mon.watch("odd", y.detach().to_sparse_coo(2))
            self.mon.watch("dense", y)
            return y

    model = PWatched()
    x = paddle.randn([4, 3])
    with hookstats.attach(model) as mon:
        model.mon = mon
        said = _run(model, x, lambda y: y.sum().backward())
        stats = mon.stats()
    assert len(said) == 1 and "sparse" in said[0] and "not measured" in said[0] and "\n" not in said[0], said
    assert "odd:watch" not in stats and "odd:watch_grad" not in stats
    y = model.fc(x).numpy().astype(np.float64)
    np.testing.assert_allclose(stats["dense:watch"]["mean"], y.mean(), rtol=1e-5)
