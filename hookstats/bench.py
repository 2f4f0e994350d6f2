"""`python -m hookstats bench`: training-step overhead, host syncs and memory of hookstats against the
tools people use (fastai ActivationStats, detach-to-CPU hooks, a wandb.watch-style histogram hook).
The models, variants and counters live here so that benchmarks/ (the full suite) measures the same thing."""
import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import types

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode


# ---------------------------------------------------------------- models (one fixed batch each)
class SmallCNN(nn.Module):
    """6 x conv/bn/relu (stride 2 every other block), pooled, one linear head: 13 modules with params."""

    def __init__(self, width=(32, 32, 64, 64, 128, 128), classes=10):
        super().__init__()
        layers, c = [], 3
        for k, w in enumerate(width):
            layers += [nn.Conv2d(c, w, 3, stride=1 + k % 2, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU()]
            c = w
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(c, classes)

    def forward(self, x):
        return self.head(self.features(x).mean((2, 3)))


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.qkv, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln2, self.fc1, self.fc2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class SmallTransformer(nn.Module):
    """Decoder-only: embedding, `blocks` pre-norm blocks of width d, final norm and vocabulary head."""

    def __init__(self, blocks=4, d=256, heads=4, vocab=1000, seq=128):
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.zeros(seq, d))
        self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(blocks)])
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, idx):
        return self.head(self.ln(self.blocks(self.emb(idx) + self.pos[: idx.shape[1]])))


class LayerStack(nn.Module):
    """`n` small Linear(width, width) + ReLU layers: per-call fixed costs dominate."""

    def __init__(self, n, width=32):
        super().__init__()
        self.layers = nn.Sequential(*[m for _ in range(n) for m in (nn.Linear(width, width), nn.ReLU())])

    def forward(self, x):
        return self.layers(x)


def make_workload(name, seed=0, device="cpu"):
    """(model, step): step() runs one SGD training step on a fixed batch and returns nothing."""
    torch.manual_seed(seed)
    if name == "cnn":
        model, x, y = SmallCNN(), torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,))
    elif name == "transformer":
        model, x = SmallTransformer(), torch.randint(0, 1000, (16, 128))
        y = torch.randint(0, 1000, (16 * 128,))
    elif name.startswith("stack"):
        model, x, y = LayerStack(int(name[5:])), torch.randn(16, 32), torch.randint(0, 32, (16,))
    else:
        raise ValueError(f"unknown workload {name!r}: cnn, transformer or stackN")
    model, x, y = model.to(device), x.to(device), y.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def step():
        out = model(x)
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    model.train()
    return model, step


# ---------------------------------------------------------------- variants: install(model) -> Installed
class Installed:
    def __init__(self, after_step=None, remove=None, memory=None):
        self.after_step = after_step or (lambda: None)
        self.remove = remove or (lambda: None)
        self.memory = memory  # bytes the monitor holds, where known


def hooked_modules(model):
    """fastai's rule, shared by every variant: modules with parameters of their own."""
    return [m for m in model.modules() if next(m.parameters(recurse=False), None) is not None]


def hookstats_kwargs():
    """Every target attach() offers that is measured each step: outputs, their grads, param grads."""
    import inspect

    import hookstats
    params = inspect.signature(hookstats.attach).parameters
    return {k: True for k in ("outputs", "grads", "param_grads") if k in params}


@contextlib.contextmanager
def reference_backend():
    """Routes the monitor through the pure-PyTorch reference op (what runs when the extension is missing)."""
    from . import _ops, reference
    saved = _ops.accumulate_, _ops.accumulate_many_
    _ops.accumulate_, _ops.accumulate_many_ = reference.accumulate_, reference.accumulate_many_
    try:
        yield
    finally:
        _ops.accumulate_, _ops.accumulate_many_ = saved


def install_hookstats(model, reference=False, **config):
    import hookstats
    ctx = reference_backend() if reference else contextlib.nullcontext()
    ctx.__enter__()
    mon = hookstats.attach(model, **hookstats_kwargs(), **config)

    def remove():
        mon.remove()
        ctx.__exit__(None, None, None)
    return Installed(remove=remove, memory=lambda: monitor_bytes(mon))


def monitor_bytes(mon):
    mem = mon.memory() if hasattr(mon, "memory") else None
    if isinstance(mem, dict):
        return int(mem.get("device_bytes", 0) + mem.get("host_staging_bytes", 0))
    return int(mem) if mem is not None else None


def install_fastai(model, with_hist):
    from fastai.callback.hook import ActivationStats
    cb = ActivationStats(with_hist=with_hist)  # defaults: cpu=True, detach=True, every=None
    cb.learn = types.SimpleNamespace(model=model, training=True, train_iter=0)
    cb.before_fit()

    def after_step():
        cb.after_batch()
        cb.learn.train_iter += 1
    return Installed(after_step, cb.after_fit)


def install_store(model, to_cpu):
    """The hand-written way (fastai's Hook(cpu=True)): keep every output of every hooked module."""
    kept = []

    def hook(m, args, out):
        if isinstance(out, torch.Tensor):
            kept.append(out.detach().cpu() if to_cpu else out.detach())
    handles = [m.register_forward_hook(hook) for m in hooked_modules(model)]

    def remove():
        for h in handles:
            h.remove()
        kept.clear()
    return Installed(remove=remove)


def install_wandb_style(model, bins=64):
    """wandb.watch(log="gradients", log_freq=1): per parameter gradient, drop non-finite values, read
    min and max to the host, histc over that range, copy the counts to the host."""
    def hook(g):
        flat = g.detach().reshape(-1)
        if not torch.isfinite(flat).all():
            flat = flat[torch.isfinite(flat)]
        lo, hi = flat.min().item(), flat.max().item()
        flat.histc(bins=bins, min=lo, max=hi).cpu()
    handles = [p.register_hook(hook) for p in model.parameters() if p.requires_grad]
    return Installed(remove=lambda: [h.remove() for h in handles])


VARIANTS = {
    "no hooks": lambda m: Installed(),
    "hookstats": install_hookstats,
    "hookstats (reference op)": lambda m: install_hookstats(m, reference=True),
    "hookstats (histograms off)": lambda m: install_hookstats(m, linear_hist=False, log_hist=False),
    "fastai ActivationStats": lambda m: install_fastai(m, with_hist=False),
    "fastai ActivationStats(with_hist)": lambda m: install_fastai(m, with_hist=True),
    "detach-to-CPU (store)": lambda m: install_store(m, to_cpu=True),
    "detach on device (store)": lambda m: install_store(m, to_cpu=False),
    "wandb.watch-style grad hist": install_wandb_style,
}


def available_variants():
    try:
        import fastai.callback.hook  # noqa: F401
        return list(VARIANTS)
    except ImportError:
        return [v for v in VARIANTS if not v.startswith("fastai")]


# ---------------------------------------------------------------- host syncs
class SyncCounter(TorchDispatchMode):
    """Counts what blocks the host on a GPU: .item() (aten._local_scalar_dense), data-dependent shapes
    (nonzero, masked_select: boolean indexing) and blocking device-to-host copies."""

    SYNC_OPS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select")

    def __init__(self):
        super().__init__()
        self.counts = {}

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func._schema.name
        if name in self.SYNC_OPS:
            self.counts[name] = self.counts.get(name, 0) + 1
        elif name in ("aten::_to_copy", "aten::copy_") and self._device_to_host(func, args, kwargs, out):
            self.counts["device-to-host copy"] = self.counts.get("device-to-host copy", 0) + 1
        return out

    @staticmethod
    def _device_to_host(func, args, kwargs, out):
        """A device-to-host copy that blocks the host: a non_blocking copy into pinned memory does not."""
        is_copy = func._schema.name == "aten::copy_"
        src = args[1] if is_copy else args[0]
        dst = args[0] if is_copy else out
        if not (isinstance(src, torch.Tensor) and isinstance(dst, torch.Tensor)
                and src.device.type != "cpu" and dst.device.type == "cpu"):
            return False
        non_blocking = (kwargs or {}).get("non_blocking", args[2] if is_copy and len(args) > 2 else False)
        return not (non_blocking and dst.is_pinned())

    @property
    def total(self):
        return sum(self.counts.values())


def count_syncs(workload, variant, steps=3):
    model, step = make_workload(workload, device=DEVICE)
    inst = VARIANTS[variant](model)
    try:
        step()
        inst.after_step()
        with SyncCounter() as c:
            for _ in range(steps):
                step()
                inst.after_step()
    finally:
        inst.remove()
    return c.total / steps, {k: v / steps for k, v in c.counts.items()}


# ---------------------------------------------------------------- timing (interleaved)
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
clock = CLOCKS["wall"]
DEVICE = "cpu"  # --device: where the workloads run


def sync():
    """Waits for the device's queued work, so that a GPU step is timed whole (no-op on CPU)."""
    if torch.device(DEVICE).type == "cuda":
        torch.cuda.synchronize(DEVICE)


def set_clock(name):
    """"wall" (default) or "cpu": this thread's CPU time, which leaves out the time spent waiting for a core
    on a shared, overloaded machine. Only meaningful with torch.set_num_threads(1): then every op of a
    CPU training step, backward included, runs on the calling thread."""
    global clock
    if name not in CLOCKS:
        raise ValueError(f"clock must be one of {list(CLOCKS)}, got {name!r}")
    if name == "cpu" and torch.get_num_threads() != 1:
        raise ValueError("the cpu clock counts only the calling thread: use it with one torch thread")
    clock = CLOCKS[name]


def time_steps(step, after_step, n):
    sync()
    t0 = clock()
    for _ in range(n):
        step()
        after_step()
    sync()
    return (clock() - t0) / n


def interleaved_step_times(workload, variants, repeats=5, steps=10, warmup=2):
    """{variant: [seconds per step, one per repeat]}. Each repeat runs every variant once, in an order
    rotated by one each repeat, on the same model (installed, warmed up, timed, removed)."""
    model, step = make_workload(workload, device=DEVICE)
    for _ in range(warmup):
        step()
    times = {v: [] for v in variants}
    for r in range(repeats):
        order = variants[r % len(variants):] + variants[: r % len(variants)]
        for v in order:
            inst = VARIANTS[v](model)
            try:
                time_steps(step, inst.after_step, warmup)
                times[v].append(time_steps(step, inst.after_step, steps))
            finally:
                inst.remove()
    return times


def summarize(samples, base):
    """median, spread (min..max) and the median of per-repeat ratios to the baseline (same repeat)."""
    med = statistics.median(samples)
    ratios = [s / b for s, b in zip(samples, base)]
    return {"median_ms": med * 1e3, "min_ms": min(samples) * 1e3, "max_ms": max(samples) * 1e3,
            "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}


# ---------------------------------------------------------------- memory (one fresh process per variant)
def proc_status_bytes(field):
    """VmRSS (now) or VmHWM (peak) of this process; ru_maxrss would include the parent's peak at fork."""
    with open("/proc/self/status") as f:
        line = next(ln for ln in f if ln.startswith(field + ":"))
    return int(line.split()[1]) * 1024


def rss_bytes():
    return proc_status_bytes("VmRSS")


def memory_child(workload, variant, steps, checkpoints):
    """Runs in its own process: RSS after warm-up and at each checkpoint, the peak, the monitor's bytes."""
    model, step = make_workload(workload, device=DEVICE)
    inst = VARIANTS[variant](model)
    step()
    inst.after_step()
    sync()
    out = {"rss_start": rss_bytes(), "rss": {}}
    for k in range(1, steps + 1):
        step()
        inst.after_step()
        if k in checkpoints:
            out["rss"][k] = rss_bytes()
    out["peak_rss"] = proc_status_bytes("VmHWM")
    out["monitor_bytes"] = inst.memory() if inst.memory else None
    if out["monitor_bytes"] is not None:
        out["targets"] = len(hooked_modules(model))
    if torch.device(DEVICE).type == "cuda":
        sync()
        out["cuda_max_allocated"] = torch.cuda.max_memory_allocated(DEVICE)
    inst.remove()
    return out


def measure_memory(workload, variant, steps, checkpoints=None):
    checkpoints = sorted(set(checkpoints or [steps]) | {steps})
    cmd = [sys.executable, "-m", "hookstats.bench", "--memory-child", workload, variant, str(steps),
           ",".join(map(str, checkpoints)), "--threads", str(torch.get_num_threads()), "--device", DEVICE]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if res.returncode != 0:
        raise RuntimeError(f"memory run of {variant!r} on {workload} failed:\n{res.stderr[-2000:]}")
    out = json.loads(res.stdout.strip().splitlines()[-1])
    out["rss"] = {int(k): v for k, v in out["rss"].items()}
    return out


# ---------------------------------------------------------------- the quick table
def machine():
    import platform
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import hookstats
    gpu = torch.cuda.get_device_name(DEVICE) if torch.device(DEVICE).type == "cuda" else None
    return {"cpu": model, "gpu": gpu, "device": DEVICE, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "hookstats_backend": hookstats.backend(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "loadavg_start": loadavg(),
            "clock": next(k for k, v in CLOCKS.items() if v is clock)}


def loadavg():
    """1, 5 and 15 minute load averages: on a shared machine they say how much the timings can be trusted."""
    try:
        with open("/proc/loadavg") as f:
            return [float(v) for v in f.read().split()[:3]]
    except OSError:
        return None


def run(workloads, variants, repeats, steps, memory_steps):
    results = {"machine": machine(), "workloads": {}}
    for w in workloads:
        times = interleaved_step_times(w, variants, repeats=repeats, steps=steps)
        rows = {}
        for v in variants:
            rows[v] = summarize(times[v], times["no hooks"])
            rows[v]["syncs_per_step"], rows[v]["sync_ops"] = count_syncs(w, v)
            if memory_steps:
                rows[v]["memory"] = measure_memory(w, v, memory_steps)
        results["workloads"][w] = rows
    return results


def fmt_mb(b):
    return "-" if b is None else f"{b / 2**20:.1f}"


def table(results):
    lines = []
    for w, rows in results["workloads"].items():
        lines.append(f"\n{w}: ms/step median [min..max], ratio to no hooks (median of per-repeat ratios)")
        head = f"{'variant':36} {'ms/step':>22} {'ratio':>7} {'syncs/step':>10}"
        has_mem = any("memory" in r for r in rows.values())
        has_gpu = any("cuda_max_allocated" in r.get("memory", {}) for r in rows.values())
        if has_mem:
            head += f" {'peak RSS MB':>11} {'RSS growth MB':>13} {'monitor KB':>10}"
        if has_gpu:
            head += f" {'GPU peak MB':>11}"
        lines.append(head)
        for v, r in rows.items():
            s = (f"{v:36} {r['median_ms']:8.1f} [{r['min_ms']:5.1f}..{r['max_ms']:5.1f}] {r['ratio']:7.3f} "
                 f"{r['syncs_per_step']:10.1f}")
            if has_mem and "memory" in r:
                m = r["memory"]
                growth = max(m["rss"].values()) - m["rss_start"]
                mon = "-" if m.get("monitor_bytes") is None else f"{m['monitor_bytes'] / 1024:.1f}"
                s += f" {fmt_mb(m['peak_rss']):>11} {fmt_mb(growth):>13} {mon:>10}"
                if has_gpu:
                    s += f" {fmt_mb(m.get('cuda_max_allocated')):>11}"
            lines.append(s)
    m = results["machine"]
    gpu = f"{m['gpu']} ({m['device']}), " if m.get("gpu") else ""
    lines.append(f"\n{gpu}{m['cpu']}, {m['cores']} cores ({m['torch_threads']} torch threads), torch {m['torch']}, "
                 f"hookstats backend {m['hookstats_backend']}, {m['clock']} clock, {m['date']}, "
                 f"load average {m['loadavg_start']}")
    return "\n".join(lines)


def _positive_int(text):
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return v


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m hookstats bench",
        description="Training-step time, host syncs and memory of hookstats against fastai ActivationStats, "
                    "detach-to-CPU hooks and a wandb.watch-style hook (quick version; the full suite is "
                    "benchmarks/ in the repository). On a loaded machine use --threads 1 --clock cpu.")
    p.add_argument("--workloads", default="cnn,transformer", help="comma list: cnn, transformer, stackN")
    p.add_argument("--variants", default=None, help="comma list (default: all available)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=5, help="timed steps per variant per repeat")
    p.add_argument("--memory-steps", type=int, default=20, help="steps of the per-variant memory runs (0: skip)")
    p.add_argument("--json", default=None, help="also write the results to this file")
    p.add_argument("--threads", type=_positive_int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--clock", default="wall", choices=list(CLOCKS),
                   help="cpu: the thread's CPU time, for a loaded shared machine (needs --threads 1)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N: where the models train")
    p.add_argument("--memory-child", nargs=4, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    global DEVICE
    try:
        dev = torch.device(a.device)
    except RuntimeError:
        p.error(f"--device: not a device: {a.device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        p.error(f"--device {a.device}: torch sees no CUDA device")
    DEVICE = a.device
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.memory_child:
        w, v, steps, cps = a.memory_child
        print(json.dumps(memory_child(w, v, int(steps), [int(c) for c in cps.split(",")])))
        return 0
    try:
        set_clock(a.clock)
    except ValueError as e:
        p.error(str(e))
    variants = available_variants() if a.variants is None else [v.strip() for v in a.variants.split(",")]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {unknown}; known: {list(VARIANTS)}")
    if "no hooks" not in variants:
        variants = ["no hooks"] + variants
    results = run(a.workloads.split(","), variants, a.repeats, a.steps, a.memory_steps)
    print(table(results))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
