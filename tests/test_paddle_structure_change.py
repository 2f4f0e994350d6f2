"""A Paddle model changed after attach (a sublayer added, replaced or deleted, a parameter replaced, weight_norm, a
frozen parameter made trainable) has layers and parameters no hook measures: the monitor says so once, naming
them, as for a torch model (tests/test_structure_change.py). Switching modes, paddle.no_grad, to_static on the
root, AMP's decorate and loading a state dict change nothing it hooked, and must not warn."""
import warnings

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

import hookstats  # noqa: E402

nn = paddle.nn
CHANGED = "the model changed after attach"


def net():
    paddle.seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def batch(seed=0):
    return paddle.to_tensor(np.random.default_rng(seed).standard_normal((3, 4)).astype("float32"))


def said_while(fn):
    """fn()'s structure warnings."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in said if CHANGED in str(w.message)]


def train(model, opt, steps=3, forward=None):
    """Trains `steps` steps through `forward` (default: the model) and reads stats(); the structure warnings."""
    forward = model if forward is None else forward

    def run():
        for i in range(steps):
            forward(batch(i)).square().mean().backward()
            opt.step()
            opt.clear_grad()
    return said_while(run)


def attached(model, **kwargs):
    opt = paddle.optimizer.SGD(0.01, parameters=model.parameters())
    if kwargs.get("param_grads"):
        kwargs["optimizer"] = opt
    return hookstats.attach(model, **kwargs), opt


def test_a_replaced_sublayer_is_named_and_its_targets_are_missing():
    model = net()
    mon, opt = attached(model)
    model[2] = nn.Linear(8, 2)
    said = train(model, opt)
    assert "2:output" not in mon.stats() and "0:output" in mon.stats()  # the new head is not measured
    mon.remove()
    assert len(said) == 1 and "1 modules that attach() would hook now carry no hook (2 (replaced))" in said[0]
    assert "mon.remove()" in said[0]


def test_an_added_sublayer_is_named():
    model = net()
    mon, opt = attached(model)
    model.add_sublayer("head", nn.Linear(2, 2))  # Sequential runs it after the others
    said = train(model, opt)
    mon.remove()
    assert len(said) == 1 and "(head)" in said[0]


class WithExtra(nn.Layer):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 8)
        self.extra = nn.Linear(8, 8)

    def forward(self, x):
        x = self.body(x)
        return self.extra(x) if hasattr(self, "extra") else x


def test_a_deleted_sublayer_is_named():
    paddle.seed(0)
    model = WithExtra()
    mon, opt = attached(model)
    del model.extra
    said = train(model, opt)
    mon.remove()
    assert len(said) == 1 and "1 hooked modules are no longer in the model (extra)" in said[0]


def test_a_replaced_parameter_is_named_with_param_grads_and_is_silent_without():
    model = net()
    mon, opt = attached(model, param_grads=True)
    model[0].weight = model[0].create_parameter([4, 8])
    said = train(model, opt)
    mon.remove()
    assert len(said) == 1 and "parameters that param_grads=True would measure carry no hook (0.weight)" in said[0]
    model = net()
    mon, opt = attached(model)  # outputs and their gradients: still the same layer's, still measured
    model[0].weight = model[0].create_parameter([4, 8])
    assert train(model, opt) == []
    mon.remove()


def test_weight_norm_after_attach_names_its_parameters_with_param_grads():
    model = net()
    mon, opt = attached(model, param_grads=True)
    nn.utils.weight_norm(model[2])
    said = train(model, opt)
    mon.remove()
    assert len(said) == 1 and "2.weight_v" in said[0] and "2.weight_g" in said[0]


def test_a_parameter_made_trainable_after_attach_is_named_with_param_grads():
    model = net()
    for p in model[2].parameters():
        p.stop_gradient = True
    mon, opt = attached(model, param_grads=True)
    assert not any(t.startswith("2.") for t in mon.stats(kind="param_grad"))
    model[2].weight.stop_gradient = False  # gradual unfreezing: its gradient is not measured
    said = train(model, opt)
    mon.remove()
    assert len(said) == 1 and "frozen at attach and unfrozen since carry no param_grads hook (2.weight)" in said[0]


def test_said_once_at_the_first_step_end_then_silent():
    model = net()
    mon, opt = attached(model, history=True, log_every=2)
    model[0] = nn.Linear(4, 8)
    said = train(model, opt, steps=2)  # the first step ends at the second forward
    assert len(said) == 1
    model[2] = nn.Linear(8, 2)  # a second change: the warning was said
    assert train(model, opt, steps=5) == [] and said_while(mon.stats) == []
    mon.remove()


class Wrapper(nn.Layer):
    """Holds the layer it wraps and calls it, with no parameters of its own."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        return self.layer(x)


def test_modes_no_grad_to_static_amp_and_wrappers_are_silent():
    model = net()
    mon, opt = attached(model, include_paramless=True, param_grads=True, eval=True, history=True, log_every=1)
    said = train(model, opt)
    model.eval()
    with paddle.no_grad():
        model(batch())
    model.train()
    with paddle.no_grad():  # evaluation in training mode
        model(batch())
    model.set_state_dict(net().state_dict())  # copied into the same parameters
    model[1] = Wrapper(model[1])  # the wrapped ReLU stays hooked
    said += train(model, opt, forward=Wrapper(model))
    said += said_while(mon.stats)
    mon.remove()
    model = net()
    mon, opt = attached(model, param_grads=True, history=True, log_every=1)
    static = paddle.jit.to_static(model, full_graph=True)  # the root only, after attach
    said += train(model, opt, forward=static)
    said += said_while(mon.stats)
    mon.remove()
    model = net()
    mon, opt = attached(model, param_grads=True, history=True, log_every=1)
    model, opt = paddle.amp.decorate(model, opt, level="O2", dtype="bfloat16")
    said += train(model, opt)
    said += said_while(mon.stats)
    mon.remove()
    assert said == []
