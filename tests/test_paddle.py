"""hookstats on PaddlePaddle models: values, gradients and parameter gradients against the test's own Paddle
hooks and NumPy in float64 (tests/paddle_oracle.py), and the model's numbers unchanged by the hooks."""
import numpy as np
import pytest

paddle = pytest.importorskip("paddle")
import torch  # noqa: E402
from paddle_oracle import PaddleOracle, assert_matches  # noqa: E402

import hookstats  # noqa: E402
from hookstats.paddle import bridge  # noqa: E402

nn = paddle.nn


def mlp():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))


def cnn():
    return nn.Sequential(nn.Conv2D(3, 8, 3, padding=1), nn.BatchNorm2D(8), nn.ReLU(),
                         nn.Conv2D(8, 8, 3, stride=2), nn.BatchNorm2D(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 7 * 7, 5))


def own_param_layers(model):
    return {n or type(model).__name__: m for n, m in model.named_sublayers(include_self=True)
            if len(m.parameters(include_sublayers=False))}


def train(model, opt, batches, oracle=None, accumulate=1, validate=None):
    for i, (x, y) in enumerate(batches):
        loss = nn.functional.mse_loss(model(x), y) if y is not None else model(x).square().mean()
        (loss / accumulate).backward()
        if (i + 1) % accumulate == 0:
            if oracle is not None:
                oracle.param_grads((f"{n}", p) for n, p in model.named_parameters())
            opt.step()
            opt.clear_grad()
        if validate is not None:
            validate()


def batches(shape, out, n, seed=0):
    rng = np.random.default_rng(seed)
    return [(paddle.to_tensor(rng.standard_normal(shape).astype("float32")),
             paddle.to_tensor(rng.standard_normal(out).astype("float32"))) for _ in range(n)]


@pytest.mark.parametrize("make,shape,out", [(mlp, [6, 8], [6, 4]), (cnn, [4, 3, 16, 16], [4, 5])])
def test_train_and_validate_against_own_hooks(make, shape, out):
    paddle.seed(1)
    model = make()
    opt = paddle.optimizer.Momentum(0.01, parameters=model.parameters())
    mon = hookstats.attach(model, hist_every=1, include_paramless=True, inputs=True, eval=True, param_grads=True, optimizer=opt)
    layers = {n or type(model).__name__: m for n, m in model.named_sublayers(include_self=True)}
    assert sorted(mon.modules) == sorted(layers)
    oracle = PaddleOracle(model, layers, inputs=True)
    val = batches(shape, out, 2, seed=9)

    def validate():
        model.eval()
        model(val[0][0])
        model.train()
        with paddle.no_grad():  # evaluation in training mode: eval, as Paddle users validate
            model(val[1][0])
    train(model, opt, batches(shape, out, 4), oracle, validate=validate)
    assert mon.step_count == 3  # a step per train forward: the validation forwards count none
    assert_matches(mon.stats("train"), oracle.records("train"))
    assert_matches(mon.stats("eval"), oracle.records("eval"))
    mon.remove()


def test_transformer_encoder_layer():
    paddle.seed(2)
    model = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0)
    opt = paddle.optimizer.Adam(1e-3, parameters=model.parameters())
    mon = hookstats.attach(model, hist_every=1)
    oracle = PaddleOracle(model, own_param_layers(model))
    assert sorted(mon.modules) == sorted(own_param_layers(model))
    train(model, opt, [(x, None) for x, _ in batches([2, 5, 16], [1], 3)])
    assert_matches(mon.stats("train"), oracle.records("train"))
    assert mon.stats("eval") == {}


def test_gradient_accumulation_manual_steps():
    """steps='manual': mon.step() after each optimizer step; parameter gradients measured once per optimizer
    step, after the micro-batches have accumulated."""
    paddle.seed(3)
    model = mlp()
    opt = paddle.optimizer.SGD(0.05, parameters=model.parameters())
    mon = hookstats.attach(model, hist_every=1, steps="manual", param_grads=True, optimizer=opt)
    oracle = PaddleOracle(model, own_param_layers(model))
    data = batches([4, 8], [4, 4], 6)
    for k in range(2):
        train(model, opt, data[3 * k: 3 * k + 3], oracle, accumulate=3)
        mon.step()
    assert mon.step_count == 2
    got = mon.stats("train", kind="param_grad")
    assert {k: r["count"] for k, r in got.items()} == {f"{n}:param_grad": 2 * p.size for n, p in model.named_parameters()}
    assert_matches(mon.stats("train"), oracle.records("train"))


def test_every_pause_reset_history():
    paddle.seed(4)
    model = mlp()
    opt = paddle.optimizer.SGD(0.05, parameters=model.parameters())
    mon = hookstats.attach(model, hist_every=1, every=2, history=True, log_every=2)
    oracle = PaddleOracle(model, own_param_layers(model))
    data = batches([4, 8], [4, 4], 7)
    for i, (x, y) in enumerate(data):
        if i == 4:
            mon.pause()
        if i == 5:
            mon.resume()
        oracle.enabled = i % 2 == 0 and i != 4  # every=2 measures steps 0, 2, 6 (4 is paused)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.clear_grad()
    assert_matches(mon.stats("train"), oracle.records("train"))
    frame = mon.history()
    steps = sorted(set(frame["step"]))
    assert steps == [0, 2]  # 6 is still open
    mon.reset()
    assert all(r["count"] == 0 for r in mon.stats().values())
    mon.remove()


def test_layer_called_twice_and_separate_calls():
    class Twice(nn.Layer):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 6)
            self.head = nn.Linear(6, 2)

        def forward(self, x):
            return self.head(paddle.tanh(self.fc(paddle.tanh(self.fc(x)))))
    for separate in (False, True):
        paddle.seed(5)
        model = Twice()
        opt = paddle.optimizer.SGD(0.05, parameters=model.parameters())
        mon = hookstats.attach(model, hist_every=1, separate_calls=separate)
        calls = {"n": 0}
        oracle = PaddleOracle(model, {})

        def post(layer, inputs, out, oracle=oracle, calls=calls):
            tid = "fc:output" + (f"@{calls['n'] % 2}" if separate else "")
            oracle.add("train", tid, out)
            gid = "fc:grad_output" + (f"@{calls['n'] % 2}" if separate else "")
            out.register_hook(lambda g: oracle.add("train", gid, g))
            calls["n"] += 1
        model.fc.register_forward_post_hook(post)
        train(model, opt, batches([3, 6], [3, 2], 3))
        got = {k: v for k, v in mon.stats().items() if k.startswith("fc:")}
        assert_matches(got, oracle.records("train"))


def test_tuple_dict_and_integer_outputs():
    class Multi(nn.Layer):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            y = self.fc(x)
            return y, {"sq": y * y, "idx": paddle.argmax(y, axis=-1)}
    paddle.seed(6)
    model = Multi()
    mon = hookstats.attach(model, hist_every=1, modules=["", "fc"])
    oracle = PaddleOracle(model, {"Multi": model, "fc": model.fc})
    for x, _ in batches([3, 4], [1], 2):
        a, d = model(x)
        (a.sum() + d["sq"].mean()).backward()
    got = mon.stats()
    assert "Multi:output[1]['idx']" not in got  # integer outputs are skipped
    assert_matches(got, oracle.records("train"))


def test_in_place_op_after_hooked_layer():
    """relu_ on a hooked layer's output after the layer returned: the output is measured as the layer returned
    it, and its gradient as Paddle's own hook at the same place receives it."""
    class InPlace(nn.Layer):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(5, 5)
            self.out = nn.Linear(5, 1)

        def forward(self, x):
            h = self.fc(x)
            nn.functional.relu_(h)
            return self.out(h)
    paddle.seed(7)
    model = InPlace()
    opt = paddle.optimizer.SGD(0.05, parameters=model.parameters())
    mon = hookstats.attach(model, hist_every=1)
    oracle = PaddleOracle(model, own_param_layers(model))
    train(model, opt, batches([4, 5], [4, 1], 3))
    assert_matches(mon.stats(), oracle.records("train"))


def test_recompute_counts_each_value_once():
    """Paddle's recompute runs a segment without grad in the forward and again, with grad, in backward: its
    values are measured once (the forward's), its gradients through the recomputed outputs, as Paddle's own hooks
    at the same places see them."""
    from paddle.distributed.fleet.utils import recompute

    class Segmented(nn.Layer):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.head = nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 1)

        def forward(self, x):
            x = x * 1.0
            x.stop_gradient = False
            return self.head(recompute(lambda h: self.b(paddle.tanh(self.a(h))), x))
    paddle.seed(14)
    model = Segmented()
    opt = paddle.optimizer.SGD(0.05, parameters=model.parameters())
    mon = hookstats.attach(model, hist_every=1)
    oracle = PaddleOracle(model, {})
    for name in ("a", "b", "head"):
        def post(layer, inputs, out, name=name):
            if not paddle.is_grad_enabled() or name == "head":  # the forward's pass (head is not recomputed)
                oracle.add("train", f"{name}:output", out)
            if not out.stop_gradient:
                out.register_hook(lambda g: oracle.add("train", f"{name}:grad_output", g))
        getattr(model, name).register_forward_post_hook(post)
    train(model, opt, batches([4, 6], [4, 1], 3))
    assert mon.step_count == 2
    assert_matches(mon.stats(), oracle.records("train"))


def test_a_root_forward_without_recompute_forgets_the_last_recomputed_layers():
    """A layer run without grad in one forward's recompute segment is plain again from the next root forward on:
    called by itself with grad after a forward without recompute, its values are measured (the oracle: the number
    of values it made)."""
    from paddle.distributed.fleet.utils import recompute

    class Switch(nn.Layer):
        def __init__(self):
            super().__init__()
            self.a, self.head = nn.Linear(6, 6), nn.Linear(6, 1)
            self.segmented = True

        def forward(self, x):
            x = x * 1.0
            x.stop_gradient = False
            return self.head(recompute(self.a, x) if self.segmented else self.a(x))
    paddle.seed(15)
    model = Switch()
    mon = hookstats.attach(model, steps="manual")
    (x, _), = batches([4, 6], [4, 1], 1)
    model(x).sum().backward()  # a: measured once, in the forward's pass without grad
    model.segmented = False
    model(x).sum().backward()
    model.a(x).sum().backward()  # by itself, with grad, outside any root forward
    mon.step()
    assert mon.stats()["a:output"]["count"] == 3 * 4 * 6
    mon.remove()


class Cast(nn.Layer):
    """Paddle's CPU kernels have no float16/bfloat16 matmul or arithmetic, but cast both ways (and its gradient)."""

    def __init__(self, dtype):
        super().__init__()
        self.dtype = dtype

    def forward(self, x):
        return x.astype(self.dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_dtypes(dtype):
    paddle.seed(8)
    model = nn.Sequential(nn.Linear(32, 32), Cast(dtype), Cast("float32"), nn.Tanh(), nn.Linear(32, 32), Cast(dtype))
    mon = hookstats.attach(model, hist_every=1, include_paramless=True)
    oracle = PaddleOracle(model, {n or "Sequential": m for n, m in model.named_sublayers(include_self=True)})
    for i, (x, _) in enumerate(batches([16, 32], [1], 2)):
        x = x * 1e3 if dtype == "float16" else x
        if i == 1:  # NaN and +-Inf in one row
            x[0, :3] = paddle.to_tensor([float("nan"), float("inf"), -float("inf")])
        model(x).astype("float32").sum().backward()
    got = mon.stats()
    assert "1:output" in got and "1:grad_output" in got and got["1:output"]["nan"] > 0
    assert_matches(got, oracle.records("train"))


def test_zero_copy_same_data_pointer():
    for dtype in ("float32", "float64", "float16", "bfloat16"):
        t = paddle.randn([5, 7]).astype(dtype)
        t.stop_gradient = False
        for view in (t, t.transpose([1, 0]), t[:, 2:5]):
            x = bridge.as_torch(view)
            assert x.data_ptr() == view.data_ptr()
            assert str(x.dtype) == f"torch.{dtype}"
            assert list(x.shape) == view.shape
            np.testing.assert_array_equal(x.float().numpy(), view.astype("float32").numpy())


def run_model(with_monitor, seed=11):
    paddle.seed(seed)
    model = cnn()
    opt = paddle.optimizer.Adam(1e-3, parameters=model.parameters())
    mon = hookstats.attach(model, hist_every=1, inputs=True, include_paramless=True, param_grads=True, optimizer=opt, eval=True) \
        if with_monitor else None
    seen = []
    for x, y in batches([2, 3, 16, 16], [2, 5], 3, seed=seed):
        out = model(x)
        out.register_hook(lambda g: seen.append(g.numpy().copy()))
        nn.functional.mse_loss(out, y).backward()
        seen += [out.numpy().copy()] + [p.grad.numpy().copy() for p in model.parameters() if p.grad is not None]
        opt.step()
        opt.clear_grad()
    model.eval()
    seen.append(model(x).numpy())
    seen += [p.numpy().copy() for p in model.parameters()]
    return seen, mon


def test_outputs_gradients_and_updates_pass_through_bit_exactly():
    plain, _ = run_model(False)
    hooked, mon = run_model(True)
    assert len(mon.stats()) > 0
    assert len(plain) == len(hooked)
    for a, b in zip(plain, hooked):
        np.testing.assert_array_equal(a, b)


def test_paddle_doc_hook_examples_beside_hookstats():
    """Paddle's documented hooks (a pre-hook returning its input, a post-hook returning 2 * output, a tensor
    gradient hook) give the numbers Paddle gives without hookstats, and hookstats measures what they return."""
    def run(attach):
        paddle.seed(12)
        linear = nn.Linear(13, 5)
        linear.register_forward_pre_hook(lambda layer, inputs: inputs)
        linear.register_forward_post_hook(lambda layer, inputs, output: output * 2)
        mon = hookstats.attach(linear, inputs=True) if attach else None
        x = paddle.to_tensor(np.arange(26, dtype="float32").reshape(2, 13) / 10)
        x.stop_gradient = False
        grads = []
        x.register_hook(lambda g: grads.append(g.numpy().copy()) or g * 3)
        out = linear(x)
        out.sum().backward()
        return out.numpy(), grads, x.grad.numpy(), linear.weight.grad.numpy(), mon, x
    want = run(False)
    got = run(True)
    for a, b in zip(want[:4], got[:4]):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    stats = got[4].stats()
    out = want[0].astype(np.float64)  # registered after the user's post-hook: hookstats sees 2 * output
    assert stats["Linear:output"]["count"] == out.size
    np.testing.assert_allclose(stats["Linear:output"]["mean"], out.mean(), rtol=1e-5)
    np.testing.assert_allclose(stats["Linear:input"]["mean"], got[5].numpy().astype(np.float64).mean(), rtol=1e-5)
    np.testing.assert_allclose(stats["Linear:grad_output"]["mean"], 1.0)


def test_watch_and_context_manager():
    class Watched(nn.Layer):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.mon = None

        def forward(self, x):
            h = self.fc(x)
            z = paddle.tanh(h)
            if self.mon is not None:
                self.mon.watch("z", z)
            return z.sum()
    paddle.seed(13)
    model = Watched()
    x = paddle.randn([3, 4])
    with hookstats.attach(model, hist_every=1) as mon:
        model.mon = mon
        model(x).backward()
        z = paddle.tanh(model.fc(x)).numpy().astype(np.float64)
        stats = mon.stats()
        np.testing.assert_allclose(stats["z:watch"]["mean"], z.mean(), rtol=1e-6)
        np.testing.assert_allclose(stats["z:watch_grad"]["mean"], 1.0)
    assert not mon.attached
    model(x)
    assert mon.stats()["z:watch"]["count"] == 12  # removed: nothing more measured


@pytest.mark.parametrize("log_every,every,want", [(4, 1, 4), (30, 1, 10), (6, 2, 3), (3, 5, 1)])
def test_a_history_gives_each_logging_window_a_histogram_step_as_for_torch(log_every, every, want):
    """Without hist_every, a history's windows each hold a histogram step: hist_every = min(10, log_every // every),
    at least 1 (the rule worked out by hand), for a Paddle layer as for a torch module."""
    layer, module = paddle.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    for model in (layer, module):
        with hookstats.attach(model, history=True, log_every=log_every, every=every) as mon:
            assert mon.cfg.hist_every == want, type(model)
    with hookstats.attach(layer, history=True, log_every=4, hist_every=7) as mon:
        assert mon.cfg.hist_every == 7  # given: kept


def test_a_tied_parameter_gradient_is_measured_once_under_its_first_name():
    paddle.seed(3)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))
    model[2].weight = model[0].weight  # tied: one parameter, one gradient, as torch names it
    opt = paddle.optimizer.SGD(0.01, parameters=model.parameters())
    mon = hookstats.attach(model, param_grads=True, optimizer=opt)
    x = paddle.to_tensor(np.random.default_rng(0).standard_normal((3, 4)).astype("float32"))
    model(x).square().mean().backward()
    want = model[0].weight.grad.numpy().astype(np.float64)
    opt.step()
    grads = mon.stats(kind="param_grad")
    mon.remove()
    assert "2.weight:param_grad" not in grads and grads["0.weight:param_grad"]["count"] == want.size
    assert np.isclose(grads["0.weight:param_grad"]["mean"], want.mean(), rtol=1e-5)


def test_a_sparse_parameter_gradient_is_named_once_and_the_others_measured():
    """nn.Embedding(sparse=True) gives a SelectedRows gradient, which the op cannot read: one warning names it, and
    the step goes on with the other parameters' gradients measured (NumPy's float64 sums of the gradients)."""
    import warnings

    class Bag(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.emb, self.fc = paddle.nn.Embedding(10, 4, sparse=True), paddle.nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(self.emb(x))
    paddle.seed(0)
    model = Bag()
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    mon = hookstats.attach(model, param_grads=True, optimizer=opt)
    seen = []
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        for k in range(3):
            model(paddle.to_tensor([[1, 2, 3 + k]])).sum().backward()
            assert model.emb.weight.grad.is_selected_rows()
            seen.append(model.fc.weight.grad.numpy().astype(np.float64).ravel())
            opt.step()
            opt.clear_grad()
    stats = mon.stats(kind="param_grad")
    mon.remove()
    about = [str(w.message) for w in said if "emb.weight" in str(w.message)]
    assert len(about) == 1 and "SelectedRows" in about[0]
    assert "emb.weight:param_grad" not in stats or stats["emb.weight:param_grad"]["count"] == 0
    v = np.concatenate(seen)
    assert stats["fc.weight:param_grad"]["count"] == v.size
    assert np.isclose(stats["fc.weight:param_grad"]["mean"], v.mean(), rtol=1e-6, atol=1e-9)
