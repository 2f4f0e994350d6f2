"""A Paddle monitor checkpoints as a torch one does (it is the same Monitor): state_dict() taken between steps and
load_state_dict() into a fresh monitor go on from the totals and the step. The oracle: the layer's outputs gathered
by the test's own Paddle hook, in float64."""
import numpy as np
import pytest

paddle = pytest.importorskip("paddle")
import hookstats  # noqa: E402


def test_state_dict_resumes_the_totals_and_the_step():
    paddle.seed(0)
    layer = paddle.nn.Sequential(paddle.nn.Linear(4, 8), paddle.nn.Tanh(), paddle.nn.Linear(8, 3))
    seen = []
    layer[0].register_forward_post_hook(lambda m, args, out: seen.append(out.numpy().astype(np.float64).ravel()))
    xs = [paddle.randn([5, 4]) for _ in range(5)]
    mon = hookstats.attach(layer)
    for x in xs[:3]:
        layer(x).sum().backward()
    saved = mon.state_dict()
    mon.remove()
    resumed = hookstats.attach(layer)
    resumed.load_state_dict(saved)
    assert resumed.step_count == mon.step_count == 3  # the next step: the checkpoint holds three
    for x in xs[3:]:
        layer(x).sum().backward()
    got, want = resumed.stats()["0:output"], np.concatenate(seen)
    assert got["count"] == want.size == 5 * 5 * 8
    np.testing.assert_allclose([got["mean"], got["min"], got["max"]], [want.mean(), want.min(), want.max()],
                               rtol=1e-6)
    assert resumed.step_count == 4
