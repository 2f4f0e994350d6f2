"""Where the benchmark models run and how a step is timed: the device, the clock, interleaved repeats."""
import statistics
import time

import torch

from .models import make_workload
from .variants import VARIANTS

CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
_chosen = {"clock": "wall", "device": "cpu"}


def clock():
    """Seconds on the chosen clock (set_clock)."""
    return CLOCKS[_chosen["clock"]]()


def clock_name():
    return _chosen["clock"]


def set_clock(name):
    """"wall" (default) or "cpu": this thread's CPU time, which leaves out the time spent waiting for a core
    on a shared, overloaded machine. Only meaningful with torch.set_num_threads(1): then every op of a
    CPU training step, backward included, runs on the calling thread."""
    if name not in CLOCKS:
        raise ValueError(f"clock must be one of {list(CLOCKS)}, got {name!r}")
    if name == "cpu" and torch.get_num_threads() != 1:
        raise ValueError("the cpu clock counts only the calling thread: use it with one torch thread")
    _chosen["clock"] = name


def device():
    """Where the workloads run: "cpu" (default), "cuda" or "cuda:N"."""
    return _chosen["device"]


def set_device(name):
    dev = torch.device(name)
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"the benchmarks run on cpu or cuda, not {dev.type}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("torch sees no CUDA device")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"torch sees {torch.cuda.device_count()} CUDA device(s), no index {dev.index}")
    _chosen["device"] = name


def sync():
    """Waits for the device's queued work, so that a GPU step is timed whole (no-op on CPU)."""
    if torch.device(device()).type == "cuda":
        torch.cuda.synchronize(device())


def timed_ops(spent):
    """([accumulate_, accumulate_many_] with this thread's clock around every call, adding to spent[0]), and the
    real pair to put back: what the op costs inside a step. Install with `accumulate.accumulate_, ... = timed`."""
    from hookstats import accumulate
    real = accumulate.accumulate_, accumulate.accumulate_many_

    def wrap(fn):
        def call(*args):
            t0 = clock()
            fn(*args)
            spent[0] += clock() - t0
        return call
    return [wrap(f) for f in real], real


def time_steps(step, after_step, n):
    sync()
    t0 = clock()
    for _ in range(n):
        step()
        after_step()
    sync()
    return (clock() - t0) / n


def interleaved_step_times(workload, variants, repeats=5, steps=10, warmup=2, tick=None):
    """{variant: [seconds per step, one per repeat]}. Each repeat runs every variant once, in an order
    rotated by one each repeat, on the same model (installed, warmed up, timed, removed). tick(variant)
    is called after each timed run (a progress bar)."""
    if repeats < 1 or steps < 1:
        raise ValueError(f"repeats and steps must be >= 1, got {repeats} and {steps}")
    model, step = make_workload(workload, device=device())
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
            if tick is not None:
                tick(v)
    return times


def summarize(samples, base):
    """median, spread (min..max) and the median of per-repeat ratios to the baseline (same repeat), with their
    interquartile range; within_noise when that range reaches 1 or below: a monitor adds work, so a ratio < 1
    is the machine's drift, never a speedup (and one or two repeats give no spread at all)."""
    med = statistics.median(samples)
    ratios = [s / b for s, b in zip(samples, base)]
    q1, q3 = ratio_iqr(ratios)
    return {"median_ms": med * 1e3, "min_ms": min(samples) * 1e3, "max_ms": max(samples) * 1e3,
            "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
            "ratio_q1": q1, "ratio_q3": q3, "repeats": len(ratios), "within_noise": len(ratios) < 3 or q1 <= 1.0}


def ratio_iqr(ratios):
    """(first, third) quartile of the per-repeat ratios (the inclusive method: within min..max)."""
    if len(ratios) < 2:
        return ratios[0], ratios[0]
    q = statistics.quantiles(ratios, n=4, method="inclusive")
    return q[0], q[2]
