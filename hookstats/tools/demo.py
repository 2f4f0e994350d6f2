"""`python -m hookstats demo`: trains a small CNN and a small transformer on synthetic data with every
target measured, and writes TensorBoard logs, CSV/JSONL history, charts, the summary table and the alerts
into an output folder (one subfolder per model). `hookstats report` rebuilds charts and tables from it."""
import contextlib
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from . import plots
from ..delivery import brief
from ..monitor import attach
from .progress import progress as show
from .run_charts import grad_norms_chart, save_run_charts
from ..sinks import HISTORY_CSV, HISTORY_JSONL, run_dir_sinks
from .summary import stats_table, summary


def best_device():
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


class SmallCNN(nn.Module):
    def __init__(self, classes=10):
        super().__init__()

        def block(i, o, stride):
            return [nn.Conv2d(i, o, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU()]

        self.body = nn.Sequential(*block(3, 16, 1), *block(16, 32, 2), *block(32, 32, 2))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(32, classes)

    def forward(self, x):
        return self.head(self.pool(self.body(x)).flatten(1))


class SmallTransformer(nn.Module):
    def __init__(self, vocab=32, d=64, layers=2, seq=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, nhead=4, dim_feedforward=2 * d, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        return self.head(self.norm(self.encoder(self.embed(tokens) + self.pos)))


def cnn_task(device, batch=32, size=16, classes=10, seed=0):
    """Images made of a class prototype plus noise: learnable in a few hundred steps."""
    g = torch.Generator().manual_seed(seed)
    protos = torch.randn(classes, 3, size, size, generator=g)

    def batch_fn():
        y = torch.randint(0, classes, (batch,), generator=g)
        x = protos[y] + 1.5 * torch.randn(batch, 3, size, size, generator=g)
        return x.to(device), y.to(device)

    return SmallCNN(classes).to(device), batch_fn, lambda out, y: nn.functional.cross_entropy(out, y)


def transformer_task(device, batch=32, seq=16, vocab=32, seed=0):
    """Predict each token's left neighbour (a copy-with-shift task)."""
    g = torch.Generator().manual_seed(seed)

    def batch_fn():
        x = torch.randint(0, vocab, (batch, seq), generator=g)
        return x.to(device), x.roll(1, dims=1).to(device)

    def loss_fn(out, y):
        return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))

    return SmallTransformer(vocab, seq=seq).to(device), batch_fn, loss_fn


TASKS = {"cnn": cnn_task, "transformer": transformer_task}
CLIP_NORM = 1.0  # the max_norm the gradient norms are told against: what clip_grad_norm_ would have clipped


@contextlib.contextmanager
def one_cpu_thread(device):
    """The demo's models are tiny: on the CPU each op is a few microseconds, which a second intra-op thread only
    costs (its spin-waits took 6x the CPU time of one thread on a shared 2-core machine). The caller's setting is
    restored after."""
    if device.type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def train_one(name, out_dir, device, steps, log_every=20, seed=0, nan_at=None, tensorboard=True, progress=True):
    """Trains one model with a monitor attached; returns (monitor, model, example batch, seconds)."""
    with one_cpu_thread(device):
        return _train(name, out_dir, device, steps, log_every, seed, nan_at, tensorboard, progress)


def _train(name, out_dir, device, steps, log_every, seed, nan_at, tensorboard, progress):
    torch.manual_seed(seed)
    model, batch_fn, loss_fn = TASKS[name](device, seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    run_dir = Path(out_dir) / name
    for old in (HISTORY_CSV, HISTORY_JSONL, Path(HISTORY_CSV).stem + "_alerts.csv"):
        (run_dir / old).unlink(missing_ok=True)  # a new demo run, not a resumed one (the file sinks append)
    mon = attach(model, inputs=True, grads=True, input_grads=True, param_grads=True, steps="manual", log_every=log_every,
                 clip_norm=CLIP_NORM, sinks=run_dir_sinks(run_dir, tensorboard=tensorboard))
    bar = show(range(steps), desc=f"{name} on {device.type}", unit="step", enabled=progress)
    t0 = time.perf_counter()
    for step in bar:
        x, y = batch_fn()
        if step == nan_at:  # --nan-at: shows the NaN alert naming the first target to see one
            with torch.no_grad():
                model.head.weight[0, 0] = float("nan")
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        mon.step()
        if not bar.disable and step % 10 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")  # the demo's own read, outside the monitor
    mon.remove()  # flushes the last steps and closes the sinks
    return mon, model, batch_fn()[0], time.perf_counter() - t0


def clipping(norms):
    """One line on the gradient norms: their median and the steps clip_grad_norm_(max_norm=clip_norm) would clip."""
    total = norms.total
    return (f"gradient norm: median {float(np.nanmedian(total)):.3g} over {len(total)} recorded steps; "
            f"clip_grad_norm_(max_norm={norms.clip_norm:g}) would clip {int(norms.clipped.sum())} of them "
            f"(grad_norms.png)")


def write_reports(name, run_dir, mon, model, example, seconds, log=print, progress=True, tensorboard=True):
    """summary.txt, the charts and, only when there are alerts, alerts.txt (one message a line) of one
    trained model; prints the summary and the alerts."""
    run_dir = Path(run_dir)
    table = str(summary(model, example, monitor=mon))
    stats = stats_table([{"target": k, **v} for k, v in mon.stats().items()], title="running totals")
    (run_dir / "summary.txt").write_text(table + "\n\n" + stats + "\n")
    alerts_file = run_dir / "alerts.txt"
    if mon.alerts:
        alerts_file.write_text("".join(a["message"] + "\n" for a in mon.alerts))
    else:
        alerts_file.unlink(missing_ok=True)  # an earlier run's alerts into the same folder are not this run's
    alerts = brief(mon.alerts)
    series = plots.collect(mon.history_sink.items())
    totals = {k: v["float_hist"] if v.get("float_hist") is not None else v["log2_hist"]
              for k, v in mon.stats().items() if v.get("float_hist") is not None or v["log2_hist"] is not None}
    norms = mon.grad_norms(clip_norm=CLIP_NORM)
    charts = save_run_charts(series, mon.history_sink.items(), run_dir / "charts", run_totals=totals,
                             extras=grad_norms_chart(norms), bar=lambda: show(
                                 desc=f"{name} charts", unit="chart", enabled=progress))
    log(f"\n== {name}: {mon.step_count} steps in {seconds:.1f} s, {len(mon.stats())} targets, monitor memory "
        f"{mon.memory()['device_bytes'] / 2**20:.2f} MiB on the device")
    log(table)
    log(clipping(norms))
    log(f"alerts ({len(alerts)}):" + "".join(f"\n  {m}" for m in alerts) if alerts else "alerts: none")
    written = ["history.csv", "history.jsonl"] + ["tensorboard/"] * tensorboard + ["summary.txt"] + \
        ["alerts.txt"] * bool(mon.alerts)
    log(f"wrote {run_dir}/: {', '.join(written)}, {len(charts)} charts in charts/")


def run(out="hookstats-demo", steps=60, device=None, models=("cnn", "transformer"), seed=0, nan_at=None,
        tensorboard=True, progress=True, log=print):
    device = torch.device(device) if device is not None else best_device()
    out = Path(out)
    for name in models:
        mon, model, example, seconds = train_one(name, out, device, steps, seed=seed, nan_at=nan_at,
                                                 tensorboard=tensorboard, progress=progress)
        write_reports(name, out / name, mon, model, example, seconds, log=log, progress=progress,
                      tensorboard=tensorboard)
    if tensorboard:
        log(f"\nTensorBoard: tensorboard --logdir {out}")
    return out
