"""hookstats with Paddle: what attach() refuses (one clear error naming it), what a hook cannot read (said once,
the rest measured, training unharmed), keywords without a Paddle meaning, and that importing hookstats does not
import Paddle."""
import subprocess
import sys
import types
import warnings

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")
import torch  # noqa: E402

import hookstats  # noqa: E402
from hookstats.paddle import bridge  # noqa: E402

nn = paddle.nn


def test_importing_hookstats_does_not_import_paddle():
    code = "import sys, hookstats, torch; hookstats.attach(torch.nn.Linear(2, 2)); print('paddle' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_not_a_model_from_any_framework():
    jax_like = types.new_class("Dense", ())
    jax_like.__module__ = "flax.linen"
    for obj in (object(), jax_like(), {"w": 1}):
        with pytest.raises(ValueError, match=r"model must be an nn.Module \(or a paddle.nn.Layer\), got .*"
                                             + type(obj).__name__):
            hookstats.attach(obj)
    for obj in (paddle.ones([2]), paddle.optimizer.SGD(0.1, parameters=nn.Linear(2, 2).parameters())):
        with pytest.raises(ValueError, match="model must be a torch.nn.Module or a paddle.nn.Layer, got paddle"):
            hookstats.attach(obj)


def test_static_graph_programs_are_refused():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    model[0] = paddle.jit.to_static(model[0])
    with pytest.raises(ValueError, match=r"layer '0' is a static-graph program \(paddle.jit.to_static\)"):
        hookstats.attach(model)
    root = paddle.jit.to_static(nn.Linear(4, 4))
    with pytest.raises(ValueError, match=r"the root layer \(Linear\) is a static-graph program"):
        hookstats.attach(root)
    paddle.enable_static()
    try:
        with pytest.raises(ValueError, match="static-graph mode"):
            hookstats.attach(nn.Linear(2, 2))
    finally:
        paddle.disable_static()


def test_keywords_without_a_paddle_meaning():
    model = nn.Linear(3, 3)
    with pytest.raises(ValueError, match="input_grads=True has no meaning for a Paddle model"):
        hookstats.attach(model, input_grads=True)
    with pytest.raises(ValueError, match="param_grads=True with a Paddle model needs optimizer="):
        hookstats.attach(model, param_grads=True)
    opt = paddle.optimizer.SGD(0.1, parameters=model.parameters())
    with pytest.raises(ValueError, match="optimizer= is used by param_grads=True only"):
        hookstats.attach(model, optimizer=opt)
    with pytest.raises(ValueError, match="types must be paddle.nn.Layer subclasses"):
        hookstats.attach(model, types=[torch.nn.Linear])
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        hookstats.attach(model, bogus=1)
    with pytest.raises(ValueError, match="modules: no layer of the model matches 'fc'"):
        hookstats.attach(model, modules=["fc"])


class Place:
    """A place the op has no kernel for (an XPU or custom device): the CPU wheel cannot make one."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"Place({self.name})"

    def is_cpu_place(self):
        return False

    def is_gpu_place(self):
        return self.name.startswith("gpu")


def test_place_rule():
    assert bridge.torch_device(paddle.CPUPlace()) == torch.device("cpu")
    assert bridge.torch_device(Place("xpu:0")) is None
    assert (bridge.torch_device(Place("gpu:0")) is None) == (not hookstats.accumulate.has_cuda_kernel())


def test_device_without_kernel(monkeypatch):
    """At attach: the parameter is named. In a hook (a tensor that moved there later): the target is named once,
    nothing else is lost and the model's numbers are unchanged."""
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    monkeypatch.setattr(bridge, "kernel_devices", lambda: ())
    with pytest.raises(ValueError, match=r"parameter 0.weight is on Place\(cpu\), where the fused op has no kernel"):
        hookstats.attach(model)
    monkeypatch.undo()
    mon = hookstats.attach(model)
    x = paddle.randn([3, 4])
    model(x).sum().backward()
    want = model(x).numpy()
    monkeypatch.setattr(bridge, "kernel_devices", lambda: ())
    with pytest.warns(RuntimeWarning, match=r"0:output is not measured: its tensor is on Place\(cpu\), where the fused "
                                         "op has no kernel") as caught:
        out = model(x)
        out.sum().backward()
        model(x).sum().backward()
    assert sum("0:output" in str(w.message) for w in caught) == 1
    np.testing.assert_array_equal(out.numpy(), want)
    assert mon.stats()["0:output"]["count"] == 24  # the two forwards before stay


def test_runs_the_paddle_notes_example():
    """docs/howto/paddle.md's example, run as written."""
    from pathlib import Path
    text = (Path(__file__).resolve().parent.parent / "docs" / "howto" / "paddle.md").read_text()
    code = text.split("```python\n")[1].split("```")[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the example warns about nothing
        exec(compile(code, "paddle.md", "exec"), {})


@pytest.mark.skipif(not paddle.is_compiled_with_cuda() or not hookstats.accumulate.has_cuda_kernel(),
                    reason="needs a CUDA build of Paddle and hookstats' CUDA kernel")
def test_gpu_on_paddle_stream():
    """A model on the GPU, driven on a Paddle side stream: the op runs ordered with it (no host sync between)."""
    paddle.set_device("gpu:0")
    paddle.seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256))
    mon = hookstats.attach(model)
    seen = []
    model[2].register_forward_post_hook(lambda layer, i, o: seen.append(o.astype("float64").numpy()))
    side = paddle.device.Stream()
    with paddle.device.stream_guard(side):
        for _ in range(3):
            x = paddle.randn([512, 256]) * 100
            model(x).sum().backward()
    side.synchronize()
    got = mon.stats()["2:output"]
    v = np.concatenate([s.reshape(-1) for s in seen])
    assert got["count"] == v.size
    np.testing.assert_allclose(got["mean"], v.mean(), rtol=1e-5)
    assert got["min"] == v.min() and got["max"] == v.max()


def test_a_copy_of_a_monitored_layer_feeds_nothing():
    """copy.deepcopy (an EMA copy) copies Paddle's hook dicts: the copy's forwards must not reach the monitor."""
    import copy
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    mon = hookstats.attach(model)
    x = paddle.randn([3, 4])
    model(x).sum().backward()
    twin = copy.deepcopy(model)
    for _ in range(3):
        twin(x).sum().backward()
    assert mon.step_count == 0
    assert mon.stats()["0:output"]["count"] == 12
    np.testing.assert_array_equal(twin(x).numpy(), model(x).numpy())
