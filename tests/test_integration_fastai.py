"""hookstats' ActivationStats against fastai's own ActivationStats on the same Learner, model and batches:
per-batch mean/std/near_zero/hist, layer_stats, hist, color_dim, plot_layer_stats, every=N, gradients."""
import numpy as np
import pytest
import torch
from torch import nn

pytest.importorskip("fastai", reason="the fastai extra is not installed")
import matplotlib  # noqa: E402

matplotlib.use("Agg")
from fastai.callback.hook import ActivationStats as FastaiActivationStats  # noqa: E402
from fastai.test_utils import synth_learner  # noqa: E402

from hookstats.integrations.fastai import ActivationStats  # noqa: E402

N_TRAIN, BS = 64, 16  # synth_learner: 4 training batches per epoch (and a validation batch)


class Capped(nn.Linear):
    """A layer whose outputs reach exactly 10.0: where fastai's histc and hookstats' bins differ."""

    def forward(self, x):
        return super().forward(x).clamp(max=10.0)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin1, self.act, self.lin2, self.lin3 = nn.Linear(1, 32), nn.ReLU(), Capped(32, 16), nn.Linear(16, 1)
        with torch.no_grad():
            self.lin1.weight.mul_(8)  # activations spread over [-10, 20]: below, inside and above fastai's range
            self.lin2.weight.mul_(3)

    def forward(self, x):
        return self.lin3(self.lin2(self.act(self.lin1(x[:, None])))).squeeze(-1)


def fit(epochs=2, model=None, ours_kw=None, **kw):
    """One Learner carrying fastai's callback and ours: the same model and batches for both."""
    theirs, ours = FastaiActivationStats(**kw), ActivationStats(log_every=3, **kw, **(ours_kw or {}))
    learn = synth_learner(n_trn=N_TRAIN // BS, n_val=1, model=model or Net(), cbs=[theirs, ours], lr=1e-4)
    learn.dls.train.bs = BS
    tens = []  # every training output of lin2, to count the exact 10.0 values
    learn.model.lin2.register_forward_hook(lambda m, a, o: tens.append((o == 10.0).sum().item()) if m.training else None)
    with learn.no_logging():
        learn.fit(epochs)
    return theirs, ours, tens


def assert_batch_matches(t, o, exact_tens=0, last=False):
    assert abs(o["mean"] - t["mean"]) <= 1e-5 * (abs(t["mean"]) + t["std"])  # fastai's is float32
    np.testing.assert_allclose(o["std"], t["std"], rtol=1e-5)
    assert o["near_zero"] == t["near_zero"]
    if "hist" in t:
        expect = t["hist"].clone()
        if last:
            expect[-1] -= exact_tens  # fastai counts x == 10.0 in its last bin, hookstats as overflow
        assert o["hist"].dtype == torch.float32 and torch.equal(o["hist"], expect)


def test_stats_reproduce_fastai_per_batch_including_histogram_edges():
    theirs, ours, tens = fit(with_hist=True)
    assert len(ours.stats) == len(theirs.stats) == 2 * N_TRAIN // BS  # training batches only
    assert sum(tens) > 0, "the test model must produce exact 10.0 values"
    for b, (tb, ob) in enumerate(zip(theirs.stats, ours.stats)):
        assert len(tb) == len(ob) == 3
        for m, (t, o) in enumerate(zip(tb, ob)):
            assert_batch_matches(t, o, exact_tens=tens[b] if m == 1 else 0, last=True)
    assert sum(t["hist"].sum() for tb in theirs.stats for t in tb) > 0
    assert not ours.monitor.attached  # remove_end


def test_layer_stats_hist_and_plots_work_on_hookstats_numbers():
    theirs, ours, _ = fit(with_hist=True, epochs=1)
    for idx in (0, 2):
        for t, o in zip(theirs.layer_stats(idx), ours.layer_stats(idx)):
            np.testing.assert_allclose(list(o), list(t), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ours.hist(idx), theirs.hist(idx))
        ours.color_dim(idx)
        ours.plot_layer_stats(idx)
    matplotlib.pyplot.close("all")


def test_every_and_modules_arguments_follow_fastai():
    kw = dict(every=3, with_hist=False)
    theirs, ours, _ = fit(**kw)
    assert len(ours.stats) == len(theirs.stats) == len(range(0, 2 * N_TRAIN // BS, 3))
    for tb, ob in zip(theirs.stats, ours.stats):
        for t, o in zip(tb, ob):
            assert "hist" not in o
            assert_batch_matches(t, o)

    net = Net()
    cb = ActivationStats(modules=[net.lin3])
    learn = synth_learner(n_trn=2, n_val=1, model=net, cbs=[cb])
    with learn.no_logging():
        learn.fit(1)
    assert all(len(b) == 1 for b in cb.stats) and len(cb.stats) == 2


def test_gradients_with_is_forward_false():
    theirs, ours, _ = fit(is_forward=False, epochs=1)
    assert len(ours.stats) == len(theirs.stats) > 0
    for tb, ob in zip(theirs.stats, ours.stats):
        for t, o in zip(tb, ob):  # fastai's backward hook gets grad_output as a tuple: a list of one dict
            assert isinstance(o, list) and len(o) == len(t) == 1
            assert_batch_matches(t[0], o[0])


def test_modules_outside_the_model_are_rejected():
    cb = ActivationStats(modules=[nn.Linear(1, 1)])
    learn = synth_learner(n_trn=2, n_val=1, model=Net(), cbs=[cb])
    with pytest.raises(ValueError, match="not modules of learn.model"), learn.no_logging():
        learn.fit(1)


def test_a_training_batch_needs_no_host_sync():
    from helpers import no_host_sync
    net = Net()
    cb = ActivationStats(with_hist=True, remove_end=False, log_every=100)
    learn = synth_learner(n_trn=2, n_val=1, model=net, cbs=[cb])
    with learn.no_logging():
        learn.fit(1)
    learn.training = True  # as TrainEvalCallback sets it for a training batch
    net.train()
    before = len(cb.stats)
    with no_host_sync() as ops:  # forward hooks, op, step end and the device-side history record
        learn.model(torch.randn(BS))
        cb.after_batch()
    assert any("hookstats" in op for op in ops)
    assert len(cb.stats) == before + 1  # reading stats is where the host transfer happens
    cb.monitor.remove()


@pytest.mark.parametrize("with_hist", [False, True])
def test_float_buckets_only_when_asked_for_and_fastais_numbers_either_way(with_hist):
    """By default the drop-in counts what fastai's numbers need (the linear bins only with with_hist, no float
    buckets); float_hist=True adds the buckets (against the test's own float_oracle of every training output)."""
    from float_oracle import float_counts
    for float_hist in (False, True):
        net, outs = Net(), []
        net.lin1.register_forward_hook(lambda m, a, o: outs.append(o.detach().numpy().copy()) if m.training else None)
        theirs, ours, tens = fit(epochs=1, model=net, ours_kw={"float_hist": float_hist} if float_hist else None,
                                 with_hist=with_hist)
        cfg = ours.monitor.cfg
        assert (cfg.float_hist, cfg.linear_hist, cfg.log_hist) == (float_hist, with_hist, float_hist)
        assert len(ours.stats) == len(theirs.stats) > 0
        for b, (tb, ob) in enumerate(zip(theirs.stats, ours.stats)):
            for m, (t, o) in enumerate(zip(tb, ob)):
                assert_batch_matches(t, o, exact_tens=tens[b] if m == 1 else 0, last=True)
                assert ("hist" in o) == with_hist
        rec = ours.monitor.stats()["lin1:output"]
        if float_hist:
            np.testing.assert_array_equal(rec["float_hist"], float_counts(np.concatenate([o.ravel() for o in outs])))
        else:
            assert rec["float_hist"] is None and rec["log2_hist"] is None
    with pytest.raises(ValueError, match="float_hist must be True or False"):
        ActivationStats(float_hist=1)


class WithLoneParameter(Net):
    """A parameter of the model's own beside its children: fastai's flatten_model wraps it in a ParameterModule
    that is hooked and never called."""

    def __init__(self):
        super().__init__()
        self.shift = nn.Parameter(torch.full((1,), 0.5))

    def forward(self, x):
        return super().forward(x) + self.shift


def test_a_lone_parameter_gets_none_every_batch_as_in_fastai():
    theirs, ours, _ = fit(epochs=1, model=WithLoneParameter(), with_hist=False)
    assert len(ours.stats) == len(theirs.stats) > 0
    for tb, ob in zip(theirs.stats, ours.stats):
        assert len(tb) == len(ob) == 4 and tb[3] is None and ob[3] is None
        for t, o in zip(tb[:3], ob[:3]):
            assert_batch_matches(t, o)
