"""HookStatsCallback with a real Lightning Trainer on CPU: logged windows vs a float64 NumPy oracle over
the same training batches, in the trainer's own rows (CSVLogger read back), histograms through a
TensorBoardLogger (read back with TensorBoard's reader), validation kept out, hooks removed at fit end."""
import csv

import numpy as np
import pytest
import torch
from helpers import oracle
from torch import nn
from torch.nn import functional as F

from hookstats.config import StatsConfig
from hookstats.records import finalize

pytestmark = pytest.mark.usefixtures("every_step_histograms")  # their oracles count every step's histograms

L = pytest.importorskip("lightning.pytorch", reason="the lightning extra is not installed")
from lightning.pytorch.loggers.logger import Logger  # noqa: E402
from lightning.pytorch.utilities import rank_zero_only  # noqa: E402

from hookstats.integrations.lightning import HookStatsCallback  # noqa: E402

EPOCHS, TRAIN_BATCHES, EVERY = 2, 4, 3


class MemoryLogger(Logger):
    def __init__(self):
        super().__init__()
        self.rows = []

    @property
    def name(self):
        return "memory"

    @property
    def version(self):
        return 0

    @rank_zero_only  # as Lightning's own loggers (CSVLogger, TensorBoardLogger, WandbLogger) do
    def log_metrics(self, metrics, step=None):
        self.rows.append((step, dict(metrics)))

    def log_hyperparams(self, params, *args, **kwargs):
        pass


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.net(x), y)  # not self(x): the callback must not rely on the root forward
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.mse_loss(self.net(x) * 100, y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader(n, seed):
    g = torch.Generator().manual_seed(seed)
    ds = torch.utils.data.TensorDataset(torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g))
    return torch.utils.data.DataLoader(ds, batch_size=5)


def fit(logger, cb, log_every_n_steps=1, accumulate=1, epochs=EPOCHS):
    """Fits Tiny with the callback; returns {module name: [activations of each training batch]}."""
    model = Tiny()
    seen = []  # (module name, activations) of training batches only, in order
    for name in ("0", "2"):
        model.net.get_submodule(name).register_forward_hook(
            lambda m, a, o, name=name: seen.append((name, o.detach().double().clone())) if m.training else None)
    trainer = L.Trainer(max_epochs=epochs, limit_train_batches=TRAIN_BATCHES, limit_val_batches=2,
                        num_sanity_val_steps=1, log_every_n_steps=log_every_n_steps, accelerator="cpu", devices=1,
                        logger=logger, callbacks=[cb], enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accumulate_grad_batches=accumulate)
    trainer.fit(model, loader(20, 0), loader(10, 1))
    assert not cb.monitor.attached  # removed at fit end
    return {n: [t for nm, t in seen if nm == n] for n in ("0", "2")}


def window_record(batches, cfg):
    """The float64 oracle's record of the activations of a window of batches."""
    x = torch.cat([t.reshape(-1) for t in batches])
    return finalize(*oracle(x, cfg), cfg)


def test_lightning_callback_logs_windows_that_match_the_oracle():
    logger = MemoryLogger()
    cb = HookStatsCallback(nbins=8, lo=-2, hi=2)
    per_batch = fit(logger, cb, log_every_n_steps=EVERY)
    logged = [(s, {k: v for k, v in m.items() if k.startswith("hookstats/")}) for s, m in logger.rows]
    # in the trainer's own rows: its train_loss and epoch are there too, at the trainer's step
    assert all("train_loss" in m and "epoch" in m for s, m in logger.rows if any(k.startswith("hookstats/") for k in m))
    logged = [(s, m) for s, m in logged if m]
    batches = EPOCHS * TRAIN_BATCHES
    # the trainer logs batch k (0-based) at step k; windows end on every EVERY-th optimizer step
    assert [s for s, _ in logged] == [k - 1 for k in range(EVERY, batches + 1, EVERY)]
    assert all(len(v) == batches for v in per_batch.values())  # the oracle's data: train batches only
    for w, (_, metrics) in enumerate(logged):
        for n in ("0", "2"):
            x = torch.cat([t.reshape(-1) for t in per_batch[n][w * EVERY:(w + 1) * EVERY]]).numpy()
            base = f"hookstats/net.{n}/output/"
            # the op's float32 accumulation: mean within 1e-6 of (|mean| + std), as in tests/test_accumulate.py
            assert abs(metrics[base + "mean"] - x.mean()) <= 1e-6 * (abs(x.mean()) + x.std())
            np.testing.assert_allclose(metrics[base + "std"], x.std(ddof=1), rtol=1e-6)
            np.testing.assert_allclose([metrics[base + "min"], metrics[base + "max"]], [x.min(), x.max()], rtol=1e-6)
            assert metrics[base + "near_zero"] == np.mean(np.abs(x.astype(np.float32)) <= np.float32(1e-6))
            assert metrics[base + "nan"] == 0
            gbase = f"hookstats/net.{n}/grad_output/"
            assert gbase + "mean" in metrics and np.isfinite(metrics[gbase + "std"])


def read_metrics_csv(logger):
    with open(f"{logger.log_dir}/metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_lightning_metrics_share_the_trainers_csv_rows(tmp_path):
    """CSVLogger: each window is in the trainer's row of that step (train_loss and epoch filled in), no
    row of its own."""
    from lightning.pytorch.loggers import CSVLogger
    logger = CSVLogger(tmp_path, name="csv")
    cb = HookStatsCallback(log_every=2, stats=("mean", "std"))
    per_batch = fit(logger, cb, log_every_n_steps=2)
    rows = read_metrics_csv(logger)
    train_rows = [r for r in rows if r.get("train_loss")]
    hs_rows = [r for r in rows if r.get("hookstats/net.0/output/mean")]
    assert [int(r["step"]) for r in train_rows] == [1, 3, 5, 7]
    assert hs_rows == train_rows and all(r["epoch"] != "" for r in hs_rows)
    cfg = StatsConfig()
    for r in hs_rows:
        k = int(r["step"]) + 1  # batches done
        w = window_record(per_batch["0"][k - 2:k], cfg)
        np.testing.assert_allclose([float(r["hookstats/net.0/output/mean"]), float(r["hookstats/net.0/output/std"])],
                                   [w["mean"], w["std"]], rtol=1e-5)


def test_lightning_histograms_reach_a_tensorboard_logger(tmp_path):
    """TensorBoardLogger: scalars and both histograms of each window at the trainer's own step, read back
    with TensorBoard's EventAccumulator and compared with the oracle's bins; gradient accumulation: the
    windows end on optimizer steps."""
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    logger = TensorBoardLogger(tmp_path, name="tb")
    cb = HookStatsCallback(nbins=8, lo=-2, hi=2)  # windows: the trainer's log_every_n_steps
    per_batch = fit(logger, cb, log_every_n_steps=2, accumulate=2, epochs=2)
    acc = EventAccumulator(logger.log_dir, size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    loss_steps = [e.step for e in acc.Scalars("train_loss")]
    base = "hookstats/net.0/output"
    means = acc.Scalars(f"{base}/mean")
    hists, logs = acc.Histograms(f"{base}/hist"), acc.Histograms(f"{base}/log2_abs")
    # 2 epochs x 4 batches, 2 per optimizer step: optimizer steps 1..4, logged every 2 -> trainer steps 1, 3
    assert loss_steps == [e.step for e in means] == [e.step for e in hists] == [e.step for e in logs] == [1, 3]
    cfg = StatsConfig(nbins=8, lo=-2, hi=2)
    for i, (m, h, lg) in enumerate(zip(means, hists, logs)):
        w = window_record(per_batch["0"][4 * i: 4 * (i + 1)], cfg)  # 2 optimizer steps x 2 batches
        assert m.value == pytest.approx(w["mean"], rel=1e-5)
        assert list(h.histogram_value.bucket) == [w["underflow"], *w["hist"], w["overflow"]]
        np.testing.assert_allclose(list(h.histogram_value.bucket_limit)[:-1], w["hist_edges"], rtol=1e-6)
        nz = np.flatnonzero(w["log2_hist"][1:])
        assert list(lg.histogram_value.bucket) == list(w["log2_hist"][1:][nz[0]: nz[-1] + 1])


def test_lightning_callback_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="log_every"):
        HookStatsCallback(log_every=0)
    with pytest.raises(ValueError, match=r"differs from the trainer's log_every_n_steps \(2\)"):
        fit(MemoryLogger(), HookStatsCallback(log_every=4), log_every_n_steps=2)
    with pytest.raises(ValueError, match="steps"):
        HookStatsCallback(steps="forward")


def test_importing_hookstats_imports_no_integration_or_framework():
    import subprocess
    import sys
    code = ("import sys, hookstats, hookstats.distributed; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('fastai', 'lightning', 'pytorch_lightning', "
            "'transformers', 'accelerate') or m.startswith('hookstats.integrations')); print(bad); sys.exit(bool(bad))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_lightning_histograms_reach_a_wandb_logger(tmp_path, monkeypatch):
    """WandbLogger (offline, read back from the run file): both histograms in rows at the trainer/global_step
    of the trainer's own row holding the window's scalars."""
    pytest.importorskip("wandb")
    from lightning.pytorch.loggers import WandbLogger
    from wandb_file import offline_history
    monkeypatch.setenv("WANDB_SILENT", "true")
    # mode= as well: wandb reads WANDB_MODE (which offline=True sets) only at its first use in a process
    logger = WandbLogger(save_dir=str(tmp_path), offline=True, project="hookstats-test", mode="offline")
    cb = HookStatsCallback(nbins=8, lo=-2, hi=2)
    per_batch = fit(logger, cb, log_every_n_steps=4)
    run = logger.experiment
    run.finish()
    rows = offline_history(run, min_rows=4)
    base = "hookstats/net.0/output"
    scalar_steps = [r["trainer/global_step"] for r in rows if f"{base}/mean" in r]
    hist_rows = [r for r in rows if f"{base}/hist/values" in r]
    assert scalar_steps == [r["trainer/global_step"] for r in hist_rows] == [3, 7]
    cfg = StatsConfig(nbins=8, lo=-2, hi=2)
    for i, r in enumerate(hist_rows):
        w = window_record(per_batch["0"][4 * i: 4 * (i + 1)], cfg)
        assert r[f"{base}/hist/values"] == [w["underflow"], *map(int, w["hist"]), w["overflow"]]
        nz = np.flatnonzero(w["log2_hist"][1:])
        assert r[f"{base}/log2_abs/values"] == list(w["log2_hist"][1:][nz[0]: nz[-1] + 1])


def test_lightning_a_failing_histogram_writer_does_not_stop_training(tmp_path):
    from lightning.pytorch.loggers import TensorBoardLogger

    class Broken:
        def __init__(self):
            self.scalars = []

        def add_scalar(self, tag, value, step):
            self.scalars.append((tag, step))

        def add_histogram_raw(self, *args, **kwargs):
            raise OSError("disk full")

        def flush(self):
            pass

    class BrokenLogger(TensorBoardLogger):
        writer = Broken()

        @property
        def experiment(self):
            return self.writer

        def log_hyperparams(self, *args, **kwargs):
            pass

    logger = BrokenLogger(tmp_path, name="broken")
    with pytest.warns(RuntimeWarning, match="histograms to the loggers failed and is switched off: OSError") as w:
        fit(logger, HookStatsCallback(), log_every_n_steps=2)
    assert sum("switched off" in str(x.message) for x in w) == 1
    assert [s for t, s in logger.writer.scalars if t == "hookstats/net.0/output/mean"] == [1, 3, 5, 7]


class TwoOptimizers(Tiny):
    """Manual optimization, two optimizer steps per batch (a GAN's shape): global_step grows by 2 a batch."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        x, y = batch
        for opt, part in zip(self.optimizers(), (self.net[0], self.net[2])):
            loss = F.mse_loss(self.net(x), y)
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
        self.log("train_loss", loss)

    def configure_optimizers(self):
        return [torch.optim.SGD(self.net[0].parameters(), lr=0.1), torch.optim.SGD(self.net[2].parameters(), lr=0.1)]


def test_lightning_manual_optimization_windows_follow_the_trainers_rows(tmp_path):
    from lightning.pytorch.loggers import CSVLogger
    logger = CSVLogger(tmp_path, name="manual")
    cb = HookStatsCallback(stats=("mean",), modules=["net.0"])
    trainer = L.Trainer(max_epochs=EPOCHS, limit_train_batches=TRAIN_BATCHES, limit_val_batches=0,
                        log_every_n_steps=2, accelerator="cpu", devices=1, logger=logger, callbacks=[cb],
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    model = TwoOptimizers()
    seen = []  # net.0's outputs: two forwards per batch
    model.net[0].register_forward_hook(lambda m, a, o: seen.append(o.detach().double().clone()))
    trainer.fit(model, loader(20, 0))
    assert trainer.global_step == 2 * EPOCHS * TRAIN_BATCHES
    rows = read_metrics_csv(logger)
    train_rows = [r for r in rows if r.get("train_loss")]
    hs_rows = [r for r in rows if r.get("hookstats/net.0/output/mean")]
    assert [int(r["step"]) for r in train_rows] == [1, 3, 5, 7]
    assert hs_rows == train_rows  # one window per trainer row, none left over to repeat
    for w, r in enumerate(hs_rows):  # a window: 2 batches, 4 forwards
        want = window_record(seen[4 * w: 4 * (w + 1)], StatsConfig())
        assert float(r["hookstats/net.0/output/mean"]) == pytest.approx(want["mean"], rel=1e-5, abs=1e-7)


class Stepped(torch.optim.SGD):
    """SGD that keeps, per step, the float64 gradients it steps with (after Lightning's accumulation and clipping,
    which run inside step(closure))."""

    def __init__(self, params, lr):
        super().__init__(params, lr=lr)
        self.seen = []

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        self.seen.append([p.grad.detach().double().clone() for p in self.param_groups[0]["params"]])
        super().step()
        return loss


class Clipped(Tiny):
    def configure_optimizers(self):
        self.opt = Stepped(self.parameters(), lr=0.1)
        return self.opt


def test_lightning_param_grads_are_what_each_optimizer_step_used_with_accumulation_and_clipping():
    import warnings
    logger, cb = MemoryLogger(), HookStatsCallback(param_grads=True, stats=("mean", "max", "count"))
    model = Clipped()
    trainer = L.Trainer(max_epochs=2, limit_train_batches=TRAIN_BATCHES, limit_val_batches=1, log_every_n_steps=1,
                        accelerator="cpu", devices=1, logger=logger, callbacks=[cb], enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accumulate_grad_batches=2,
                        gradient_clip_val=0.05)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, loader(20, 0), loader(10, 1))
    assert not [str(w.message) for w in caught if "hookstats" in str(w.message)]
    steps = EPOCHS * TRAIN_BATCHES // 2
    assert len(model.opt.seen) == steps and cb.monitor.step_count == steps  # a step is an optimizer step
    rows = [(s, {k: v for k, v in m.items() if "/param_grad/" in k}) for s, m in logger.rows]
    rows = [(s, m) for s, m in rows if m]
    assert [s for s, _ in rows] == list(range(steps))
    for s, m in rows:
        for name, g in zip(("net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"), model.opt.seen[s]):
            base = f"hookstats/{name}/param_grad/"
            assert m[base + "count"] == g.numel()
            np.testing.assert_allclose([m[base + "mean"], m[base + "max"]], [g.mean().item(), g.max().item()],
                                       rtol=1e-5)


class Seen(Tiny):
    """Tiny keeping each training batch's net.0 output with the optimizer steps taken before it."""

    def __init__(self):
        super().__init__()
        self.seen = []
        self.net[0].register_forward_hook(
            lambda m, a, o: self.seen.append((self.trainer.global_step, o.detach().double().clone()))
            if m.training else None)


def test_lightning_resume_from_a_checkpoint_keeps_the_open_window(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    def run(epochs, model, ckpt_path=None):
        logger = MemoryLogger()
        trainer = L.Trainer(max_epochs=epochs, limit_train_batches=TRAIN_BATCHES, limit_val_batches=1,
                            log_every_n_steps=3, accelerator="cpu", devices=1, logger=logger,
                            callbacks=[HookStatsCallback(stats=("mean", "count")),
                                       ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=5, save_top_k=-1,
                                                       filename="{step}")],
                            enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
        trainer.fit(model, loader(20, 0), loader(10, 1), ckpt_path=ckpt_path)
        return {s: m for s, m in logger.rows if "hookstats/net.0/output/count" in m}

    first, again = Seen(), Seen()
    run(2, first)  # saved at 5 optimizer steps, inside the window that ends at step 5
    logged = run(3, again, ckpt_path=tmp_path / "step=5.ckpt")
    assert sorted(logged) == [5, 8, 11]
    window = torch.cat([o.reshape(-1) for s, o in first.seen if s in (3, 4)] +
                       [o.reshape(-1) for s, o in again.seen if s == 5])
    assert logged[5]["hookstats/net.0/output/count"] == window.numel()  # batches 3 and 4 were before the save
    np.testing.assert_allclose(logged[5]["hookstats/net.0/output/mean"], window.mean().item(), rtol=1e-6)
    ckpt = torch.load(tmp_path / "step=5.ckpt", weights_only=False)
    state = next(v for k, v in ckpt["callbacks"].items() if "HookStatsCallback" in k)
    state["monitor"]["config"]["hist_every"] += 1  # of a run logging at another cadence: said, and the fit goes on
    torch.save(ckpt, tmp_path / "step=5.ckpt")
    with pytest.warns(RuntimeWarning, match="does not fit this run") as said:
        logged = run(3, Seen(), ckpt_path=tmp_path / "step=5.ckpt")
    assert sum("does not fit this run" in str(w.message) for w in said) == 1
    assert sorted(logged) == [5, 8, 11]  # the steps go on from the checkpoint's: the windows keep their rows


class ManualAccumulation(Tiny):
    """Manual optimization that steps its optimizer every second batch (gradient accumulation by hand)."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.manual_backward(F.mse_loss(self.net(x), y) / 2)
        if batch_idx % 2 == 1:
            opt = self.optimizers()
            opt.step()
            opt.zero_grad()

    def configure_optimizers(self):
        self.opt = Stepped(self.parameters(), lr=0.1)
        return self.opt


def test_lightning_manual_accumulation_measures_the_gradients_each_optimizer_step_used():
    logger, cb = MemoryLogger(), HookStatsCallback(param_grads=True, stats=("mean", "count"), modules=["net.0"])
    model = ManualAccumulation()
    trainer = L.Trainer(max_epochs=EPOCHS, limit_train_batches=TRAIN_BATCHES, limit_val_batches=0,
                        log_every_n_steps=2, accelerator="cpu", devices=1, logger=logger, callbacks=[cb],
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, loader(20, 0))
    rows = [m for s, m in logger.rows if "hookstats/net.0.weight/param_grad/count" in m]
    assert len(rows) == len(model.opt.seen) == EPOCHS * TRAIN_BATCHES // 2  # a window: two batches, one step
    for m, (weight, *_) in zip(rows, model.opt.seen):
        assert m["hookstats/net.0.weight/param_grad/count"] == weight.numel()
        x = weight.numpy()
        assert abs(m["hookstats/net.0.weight/param_grad/mean"] - x.mean()) <= 1e-6 * (abs(x.mean()) + x.std())


def test_lightning_manual_optimization_resumed_windows_follow_the_trainers_rows(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    def run(epochs, version, ckpt_path=None):
        logger = CSVLogger(tmp_path, name="manual", version=version)
        trainer = L.Trainer(max_epochs=epochs, limit_train_batches=TRAIN_BATCHES, limit_val_batches=0,
                            log_every_n_steps=2, accelerator="cpu", devices=1, logger=logger,
                            callbacks=[HookStatsCallback(stats=("mean",), modules=["net.0"]),
                                       ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=6, save_top_k=-1,
                                                       filename="{step}")],
                            enable_progress_bar=False, enable_model_summary=False)
        model = TwoOptimizers()
        seen = []  # net.0's outputs: two forwards per batch
        model.net[0].register_forward_hook(lambda m, a, o: seen.append(o.detach().double().clone()))
        trainer.fit(model, loader(20, 0), ckpt_path=ckpt_path)
        return read_metrics_csv(logger), seen

    run(1, 0)  # saved after 3 batches (6 optimizer steps)
    rows, seen = run(EPOCHS, 1, ckpt_path=tmp_path / "step=6.ckpt")
    train_rows = [r for r in rows if r.get("train_loss")]
    hs_rows = [r for r in rows if r.get("hookstats/net.0/output/mean")]
    assert [int(r["step"]) for r in train_rows] == [3, 5, 7]
    assert hs_rows == train_rows
    # batch 3 (the first after the resume) ends the window of batches 2 and 3; batch 2 ran before the save
    for w, r in enumerate(hs_rows[1:]):  # batches 4-5 and 6-7: 4 forwards each, after batch 3's 2
        want = window_record(seen[2 + 4 * w: 2 + 4 * (w + 1)], StatsConfig())
        assert float(r["hookstats/net.0/output/mean"]) == pytest.approx(want["mean"], rel=1e-5, abs=1e-7)
