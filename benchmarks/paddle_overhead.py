"""Training-step cost of hookstats on a Paddle CNN beside the same network shape in PyTorch, in one run: per
framework no hooks, hookstats with its defaults (hookstats.attach(model)), the same statistics written as plain
hooks of that framework (moments, min/max, near-zero and NaN counts, a 40-bin histogram, on device: what a user
writes by hand) and the floor (a plain hook reading each value once: a sum). The CNN is hookstats.tools.bench's: 6 x
conv/bn/relu (stride 2 every other block), mean-pooled, a linear head; hooked: the 13 layers with parameters.

One thread (OMP_NUM_THREADS=1 and torch.set_num_threads(1); the script re-runs itself with them set before
Paddle loads), the thread's CPU clock, the variants interleaved (order rotated each round), medians of the
per-round ratios to the same framework's no-hooks step and their IQR. Writes JSON to benchmarks/results/.
Run: OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/paddle_overhead.py [--rounds 12 --steps 4 --batch 32]"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
if any(os.environ.get(k) != v for k, v in ONE_THREAD.items()):
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **ONE_THREAD})

import numpy as np  # noqa: E402
import paddle  # noqa: E402
import torch  # noqa: E402

import hookstats  # noqa: E402
import results_file  # noqa: E402
from hookstats.tools import bench  # noqa: E402

# the shipped workload's channel widths, read from it, so the two networks cannot drift apart
WIDTH = tuple(m.out_channels for m in bench.SmallCNN().features if isinstance(m, torch.nn.Conv2d))
EPS, BINS, LO, HI = 1e-6, 40, -10.0, 10.0


class PaddleCNN(paddle.nn.Layer):
    """hookstats.tools.bench.SmallCNN in Paddle."""

    def __init__(self, classes=10):
        super().__init__()
        nn, layers, c = paddle.nn, [], 3
        for k, w in enumerate(WIDTH):
            layers += [nn.Conv2D(c, w, 3, stride=1 + k % 2, padding=1, bias_attr=False), nn.BatchNorm2D(w), nn.ReLU()]
            c = w
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(c, classes)

    def forward(self, x):
        return self.head(self.features(x).mean(axis=(2, 3)))


def paddle_workload(batch):
    paddle.seed(0)
    model = PaddleCNN()
    opt = paddle.optimizer.SGD(0.01, parameters=model.parameters())
    rng = np.random.default_rng(0)
    x = paddle.to_tensor(rng.standard_normal((batch, 3, 32, 32)).astype("float32"))
    y = paddle.to_tensor(rng.integers(0, 10, (batch, 1)))

    def step():
        loss = paddle.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.clear_grad()
    return model, step


def torch_workload(batch):
    torch.manual_seed(0)
    model = bench.SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))

    def step():
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return model, step


def paddle_stats(t, keep):
    a = t.abs()
    keep += [t.mean(), t.var(), t.min(), t.max(), (a <= EPS).sum(), paddle.isnan(t).sum(),
             paddle.histogram(t, bins=BINS, min=LO, max=HI)]


def torch_stats(t, keep):
    keep += [t.mean(), t.var(), t.min(), t.max(), (t.abs() <= EPS).sum(), t.isnan().sum(), t.histc(BINS, LO, HI)]


def paddle_plain(model, full):
    """Post-hooks on each layer with parameters: the output's statistics and, through a tensor hook, its gradient's."""
    keep = []

    def hook(layer, inputs, out):
        with paddle.no_grad():
            if full:
                paddle_stats(out, keep)
            else:
                keep.append(out.sum())
        if not out.stop_gradient:
            out.register_hook(lambda g: paddle_stats(g, keep) if full else keep.append(g.sum()))
    handles = [m.register_forward_post_hook(hook) for _, m in model.named_sublayers(include_self=True)
               if len(m.parameters(include_sublayers=False))]
    return handles, keep


def torch_plain(model, full):
    keep = []

    def hook(module, args, out):
        with torch.no_grad():
            if full:
                torch_stats(out, keep)
            else:
                keep.append(out.sum())
        if out.requires_grad:
            out.register_hook(lambda g: torch_stats(g, keep) if full else keep.append(g.sum()))
    handles = [m.register_forward_hook(hook) for m in model.modules() if next(m.parameters(recurse=False), None) is not None]
    return handles, keep


def install(framework, variant, model):
    """A remover for the variant installed on model."""
    if variant == "no hooks":
        return lambda: None
    if variant == "hookstats":
        mon = hookstats.attach(model)
        return mon.remove
    handles, keep = (paddle_plain if framework == "paddle" else torch_plain)(model, variant == "plain hooks")

    def remove():
        for h in handles:
            h.remove()
        keep.clear()
    return remove


VARIANTS = ("no hooks", "hookstats", "plain hooks", "floor")


def measure(batch, rounds, steps):
    runs = {(f, v): [] for f in ("paddle", "torch") for v in VARIANTS}
    walls = {k: [] for k in runs}  # wall time: CPU time well below it would mean work on other threads
    workloads = {"paddle": paddle_workload(batch), "torch": torch_workload(batch)}
    for f, (_, step) in workloads.items():
        for _ in range(2):
            step()
    keys = list(runs)
    for r in range(rounds):
        for f, v in keys[r % len(keys):] + keys[:r % len(keys)]:
            model, step = workloads[f]
            remove = install(f, v, model)
            try:
                step()  # warm: the first step after attach allocates the states
                t0, w0 = time.thread_time(), time.perf_counter()
                for _ in range(steps):
                    step()
                runs[(f, v)].append((time.thread_time() - t0) / steps)
                walls[(f, v)].append((time.perf_counter() - w0) / steps)
            finally:
                remove()
    out = {}
    for (f, v), times in runs.items():
        ratios = [t / b for t, b in zip(times, runs[(f, "no hooks")])]
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        out.setdefault(f, {})[v] = {"step_ms": statistics.median(times) * 1e3,
                                    "wall_ms": statistics.median(walls[(f, v)]) * 1e3, "ratio": statistics.median(ratios),
                                    "ratio_iqr": [q[0], q[2]], "ratios": ratios}
    return out


def table(results):
    """{"paddle: hookstats": {"step_ms", "wall_ms", "ratio", "ratio_q1", "ratio_q3", "rounds"}}."""
    return {f"{f}: {v}": {"step_ms": r["step_ms"], "wall_ms": r["wall_ms"], "ratio": r["ratio"],
                          "ratio_q1": r["ratio_iqr"][0], "ratio_q3": r["ratio_iqr"][1], "rounds": len(r["ratios"])}
            for f, rows in results.items() for v, r in rows.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--steps", type=int, default=4, help="timed steps per variant per round")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--json", default=str(Path(__file__).resolve().parent / "results" / "paddle_overhead.json"))
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    bench.set_clock("cpu")
    load = os.getloadavg()[0]
    results = measure(a.batch, a.rounds, a.steps)
    print(f"{'framework':9s} {'variant':12s} {'cpu ms':>8s} {'wall ms':>8s} {'ratio':>6s} [IQR]")
    for f, vs in results.items():
        for v, s in vs.items():
            print(f"{f:9s} {v:12s} {s['step_ms']:8.1f} {s['wall_ms']:8.1f} {s['ratio']:6.3f} "
                  f"[{s['ratio_iqr'][0]:.3f}..{s['ratio_iqr'][1]:.3f}]")
    gap = results["paddle"]["hookstats"]["ratio"] - results["torch"]["hookstats"]["ratio"]
    print(f"hookstats overhead, Paddle minus PyTorch: {gap * 100:+.2f} points; added per step: " + ", ".join(
        f"{f} {r['hookstats']['step_ms'] - r['no hooks']['step_ms']:.1f} ms" for f, r in results.items()))
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    results_file.write(a.json, table(results), results_file.machine(load_start=load) +
                       f", paddle {paddle.__version__}, the benchmark CNN's shape, batch {a.batch}", argv)


if __name__ == "__main__":
    main()
