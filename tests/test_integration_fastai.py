"""hookstats' ActivationStats against fastai's own ActivationStats on the same Learner, model and batches:
per-batch mean/std/near_zero/hist, layer_stats, hist, color_dim, plot_layer_stats, every=N, gradients."""
import io
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

pytest.importorskip("fastai", reason="the fastai extra is not installed")
import matplotlib  # noqa: E402

matplotlib.use("Agg")
from fastai.callback.core import Callback  # noqa: E402
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
    if hasattr(learn.model, "lin2"):
        learn.model.lin2.register_forward_hook(lambda m, a, o: tens.append((o == 10.0).sum().item()) if m.training
                                               else None)
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
        rec = ours.monitor.stats()["lin1:output@0"]  # each call of a module apart, as fastai keeps one
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


# ---- what fastai users rely on beyond the statistics: hooks.stored, repeated calls, export, the process exit ----

class CalledTwice(Net):
    """lin2 runs twice per forward on different inputs: fastai's hook keeps the last call's statistics."""

    def __init__(self):
        super().__init__()
        self.lin2 = nn.Linear(32, 32)

    def forward(self, x):
        h = self.act(self.lin2(self.act(self.lin1(x[:, None]))))
        return self.lin3(nn.functional.linear(self.lin2(h * 4), torch.ones(16, 32) / 32)).squeeze(-1)


class LSTMTwice(nn.Module):
    """A reused module with tuple outputs: fastai's entry is a list of dicts, one per output tensor."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lstm, self.head = nn.LSTM(1, 8, batch_first=True), nn.Linear(8, 1)

    def forward(self, x):
        out, _ = self.lstm(x.reshape(-1, 1, 1).expand(-1, 3, 1).contiguous())
        out, _ = self.lstm(out[..., :1] * 4)
        return self.head(out[:, -1]).squeeze(-1)


@pytest.mark.parametrize("model", [CalledTwice, LSTMTwice])
def test_a_module_called_twice_reports_the_call_fastai_keeps(model):
    for is_forward in (True, False):
        theirs, ours, _ = fit(epochs=1, model=model(), is_forward=is_forward, with_hist=is_forward)
        assert len(ours.stats) == len(theirs.stats) > 0
        for tb, ob in zip(theirs.stats, ours.stats):
            for m, (t, o) in enumerate(zip(tb, ob)):
                t, o = (t, o) if isinstance(t, list) else ([t], [o])
                assert len(t) == len(o) == (3 if model is LSTMTwice and is_forward and m == 0 else 1)
                for te, oe in zip(t, o):
                    assert_batch_matches(te, oe)


def test_hooks_stored_is_the_last_measured_batch_per_module_as_in_fastai():
    seen = []

    class Read(Callback):  # a user's callback reading both callbacks' hooks.stored after each training batch
        def after_batch(self):
            if self.training:
                seen.append((theirs.hooks.stored, ours.hooks.stored))

    theirs, ours = FastaiActivationStats(with_hist=True, every=1), ActivationStats(with_hist=True, every=1, log_every=3)
    learn = synth_learner(n_trn=N_TRAIN // BS, n_val=1, model=Net(), cbs=[theirs, ours, Read()], lr=1e-4)
    with learn.no_logging():
        learn.fit(1)
    assert len(seen) == N_TRAIN // BS
    for t_stored, o_stored in seen + [(theirs.hooks.stored, ours.hooks.stored)]:  # and after fit
        assert isinstance(o_stored, type(t_stored)) and len(o_stored) == len(t_stored) == 3
        for t, o in zip(t_stored, o_stored):
            assert_batch_matches(t, o, exact_tens=int(t["hist"][-1] - o["hist"][-1]), last=True)
    assert len(ours.hooks) == 3 and [h.stored for h in ours.hooks] == list(ours.hooks.stored)
    assert ours.hooks[1].stored == ours.hooks.stored[1] == ours.stats[-1][1]


def test_hooks_stored_before_any_batch_holds_none_per_module():
    cb = ActivationStats(modules=[nn.Linear(1, 1)] * 2)
    assert list(cb.hooks.stored) == [None, None]


class Pick:
    """A picklable item transform: learn.export() saves the DataLoaders' transforms."""

    def __init__(self, values):
        self.values = values

    def __call__(self, i):
        return self.values[i]


def exportable_learner(cbs, model=None):
    """A Learner that learn.export() can save: fastai Datasets (synth_learner's TensorDatasets cannot be
    exported, with any callback)."""
    from fastai.data.core import Datasets
    from fastai.learner import Learner
    torch.manual_seed(1)
    x = torch.randn(N_TRAIN)
    ds = Datasets(list(range(N_TRAIN)), [[Pick(x)], [Pick(2 * x + 3 + 0.1 * torch.randn(N_TRAIN))]],
                  splits=[list(range(N_TRAIN - BS)), list(range(N_TRAIN - BS, N_TRAIN))])
    return Learner(ds.dataloaders(bs=BS, device="cpu"), model or Net(), loss_func=nn.MSELoss(), cbs=cbs, lr=1e-4)


def same_batches(a, b):
    """Equal lists of batches of fastai entries (dicts of floats and a hist tensor, or None)."""
    assert len(a) == len(b)
    for ba, bb in zip(a, b):
        assert len(ba) == len(bb)
        for ea, eb in zip(ba, bb):
            assert (ea is None) == (eb is None)
            if ea is not None:
                assert ea.keys() == eb.keys()
                assert all(torch.equal(ea[k], eb[k]) if k == "hist" else ea[k] == eb[k] for k in ea)
    return True


def both_match(theirs, ours):
    assert len(ours.stats) == len(theirs.stats) > 0
    for tb, ob in zip(theirs.stats, ours.stats):
        for t, o in zip(tb, ob):
            assert_batch_matches(t, o, exact_tens=int(t["hist"][-1] - o["hist"][-1]) if "hist" in t else 0,
                                 last=True)


@pytest.mark.parametrize("remove_end", [True, False])
def test_export_and_load_learner_carry_the_stats_and_fit_again_with_a_fresh_monitor(tmp_path, remove_end):
    from fastai.learner import load_learner
    kw = dict(with_hist=True, remove_end=remove_end)
    theirs, ours = FastaiActivationStats(**kw), ActivationStats(log_every=3, **kw)
    learn = exportable_learner([theirs, ours])
    with learn.no_logging():
        learn.fit(1)
    before, dls = list(ours.stats), learn.dls
    learn.path = tmp_path
    learn.export("export.pkl")
    loaded = load_learner(tmp_path / "export.pkl")
    their2, our2 = (next(c for c in loaded.cbs if type(c) is k) for k in (FastaiActivationStats, ActivationStats))
    assert our2.monitor is None  # the statistics measured so far travel, the monitor does not
    both_match(their2, our2)
    assert same_batches(our2.stats, before) and len(before) == (N_TRAIN - BS) // BS
    assert same_batches([our2.hooks.stored], before[-1:])
    loaded.dls = dls
    with loaded.no_logging():
        loaded.fit(1)  # fastai's before_fit starts stats afresh; ours too, with a monitor on the loaded model
    assert our2.monitor is not None and our2.monitor.model is loaded.model
    assert len(our2.stats) == len(before)
    both_match(their2, our2)
    assert our2.monitor.attached is not remove_end
    if not remove_end:
        our2.monitor.remove()
    with learn.no_logging():
        learn.fit(1)  # the exported learner goes on too
    both_match(theirs, ours)


class SaveAfterFirstEpoch(Callback):
    """torch.save(learn) from inside fit: the hooks are on the model and the monitor is running."""

    def __init__(self, cb):
        self.cb, self.saved = cb, []

    def after_epoch(self):
        if self.epoch == 0:
            buf = io.BytesIO()
            torch.save(self.learn, buf)
            self.saved.append((buf.getvalue(), len(self.cb.stats)))


def test_a_learner_saved_during_fit_and_before_fit_loads_and_fits():
    theirs, ours = FastaiActivationStats(), ActivationStats(log_every=3)
    save = SaveAfterFirstEpoch(ours)
    learn = synth_learner(n_trn=N_TRAIN // BS, n_val=1, model=Net(), cbs=[theirs, ours], lr=1e-4)
    unfit = io.BytesIO()
    torch.save(learn, unfit)  # before any fit: no monitor yet
    with learn.no_logging():
        learn.fit(2, cbs=[save])
    assert len(ours.stats) == 2 * N_TRAIN // BS  # the save did not disturb the run
    both_match(theirs, ours)
    (blob, n_then), = save.saved
    assert n_then == N_TRAIN // BS
    for data, n in ((blob, n_then), (unfit.getvalue(), 0)):
        loaded = torch.load(io.BytesIO(data), weights_only=False)
        cb = next(c for c in loaded.cbs if type(c) is ActivationStats)
        assert cb.monitor is None and len(cb.stats) == n
        assert same_batches(cb.stats, ours.stats[:n])
        with loaded.no_logging():
            loaded.fit(1)
        assert len(cb.stats) == N_TRAIN // BS and not cb.monitor.attached
        their2 = next(c for c in loaded.cbs if type(c) is FastaiActivationStats)
        both_match(their2, cb)


EXIT_SCRIPT = """
from torch import nn
from fastai.test_utils import synth_learner
from hookstats.integrations.fastai import ActivationStats
kept = []
for kw in ({}, {"with_hist": True}, {"every": 2}, {"is_forward": False}, {"float_hist": True}):
    model = nn.Sequential(nn.Linear(1, 8), nn.ReLU(), nn.Linear(8, 1), nn.Flatten(0))
    learn = synth_learner(n_trn=3, n_val=1, model=model, cbs=[ActivationStats(remove_end=False, **kw)])
    with learn.no_logging():
        learn.fit(1)
    learn.model(learn.dls.one_batch()[0][:, None])  # an open step at exit
    kept.append(learn)
print("fitted")
"""


@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_hooks_left_on_with_remove_end_false_let_the_process_exit_cleanly(backend):
    env = dict(os.environ, HOOKSTATS_BACKEND=backend, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", EXIT_SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0 and "fitted" in r.stdout, r.stderr[-3000:]
    for bad in ("INTERNAL ASSERT", "Exception ignored", "Traceback"):
        assert bad not in r.stderr, r.stderr[-3000:]
