"""HookStatsCallback with a real Lightning Trainer on CPU: logged windows vs a float64 NumPy oracle over
the same training batches, validation kept out, hooks removed at fit end."""
import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

L = pytest.importorskip("lightning.pytorch", reason="the lightning extra is not installed")
from lightning.pytorch.loggers.logger import Logger  # noqa: E402

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
        return F.mse_loss(self.net(x), y)  # not self(x): the callback must not rely on the root forward

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.mse_loss(self.net(x) * 100, y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader(n, seed):
    g = torch.Generator().manual_seed(seed)
    ds = torch.utils.data.TensorDataset(torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g))
    return torch.utils.data.DataLoader(ds, batch_size=5)


def test_lightning_callback_logs_windows_that_match_the_oracle():
    model = Tiny()
    seen = []  # (module name, activations) of training batches only, in order
    for name in ("0", "2"):
        model.net.get_submodule(name).register_forward_hook(
            lambda m, a, o, name=name: seen.append((name, o.detach().double().clone())) if m.training else None)
    logger = MemoryLogger()
    cb = HookStatsCallback(log_every=EVERY, nbins=8, lo=-2, hi=2)
    trainer = L.Trainer(max_epochs=EPOCHS, limit_train_batches=TRAIN_BATCHES, limit_val_batches=2,
                        num_sanity_val_steps=1, log_every_n_steps=1, accelerator="cpu", devices=1, logger=logger,
                        callbacks=[cb], enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, loader(20, 0), loader(10, 1))

    assert not cb.monitor.attached  # removed at fit end
    logged = [(s, {k: v for k, v in m.items() if k.startswith("hookstats/")}) for s, m in logger.rows]
    logged = [(s, m) for s, m in logged if m]
    batches = EPOCHS * TRAIN_BATCHES
    assert [s for s, _ in logged] == list(range(EVERY, batches + 1, EVERY))  # optimizer steps = batches here
    per_batch = {n: [t for nm, t in seen if nm == n] for n in ("0", "2")}
    assert all(len(v) == batches for v in per_batch.values())  # the oracle's data: train batches only
    for w, (_, metrics) in enumerate(logged):
        for n in ("0", "2"):
            x = torch.cat([t.reshape(-1) for t in per_batch[n][w * EVERY:(w + 1) * EVERY]]).numpy()
            base = f"hookstats/net.{n}/output/"
            # the op's float32 accumulation: mean within 1e-6 of (|mean| + std), as in tests/test_ops.py
            assert abs(metrics[base + "mean"] - x.mean()) <= 1e-6 * (abs(x.mean()) + x.std())
            np.testing.assert_allclose(metrics[base + "std"], x.std(ddof=1), rtol=1e-6)
            np.testing.assert_allclose([metrics[base + "min"], metrics[base + "max"]], [x.min(), x.max()], rtol=1e-6)
            assert metrics[base + "near_zero"] == np.mean(np.abs(x.astype(np.float32)) <= np.float32(1e-6))
            assert metrics[base + "nan"] == 0
            gbase = f"hookstats/net.{n}/grad_output/"
            assert gbase + "mean" in metrics and np.isfinite(metrics[gbase + "std"])


def test_lightning_callback_rejects_bad_arguments():
    with pytest.raises(ValueError, match="log_every"):
        HookStatsCallback(log_every=0)
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
