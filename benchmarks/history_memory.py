"""Host memory and host time of the per-step history. Default: RSS growth while
mon.history() fills up to `keep` steps with many targets, against what mon.memory() reports. --time: CPU time
(1 thread, time.thread_time) per step with history=True and without, rounds interleaved in one process, and
the part spent in the flushes. Run it once per checkout to compare them:
PYTHONPATH=<checkout> python benchmarks/history_memory.py [--targets 400 --keep 1000 --steps 1100] [--time]"""
import argparse
import gc
import json
import statistics
import time

import torch
from torch import nn

import hookstats


def rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def model_of(targets):
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(16, 16) for _ in range(targets)])  # one output target each


def memory(a):
    model = model_of(a.targets)
    mon = hookstats.attach(model, grads=False, history=True, keep=a.keep)
    x = torch.randn(4, 16)
    with torch.no_grad():
        for _ in range(2):
            model(x)
        mon.flush()
        gc.collect()
        before = rss_bytes()
        for _ in range(a.steps):
            model(x)
    mon.flush()
    gc.collect()
    grown = rss_bytes() - before
    mem = mon.memory()
    records = sum(1 for _ in mon.history_sink.items())
    mon.remove()
    return {"targets": a.targets, "keep": a.keep, "steps": a.steps, "kept_records": records,
            "rss_growth_bytes": grown, "rss_growth_per_record": round(grown / records), "memory": mem}


def timed_round(model, history, steps, warmup=20):
    """(CPU ms per step, of which in flushes) over `steps` steps after `warmup`."""
    mon = hookstats.attach(model, grads=False, history=history)
    flush_s = [0.0]
    if history:
        inner = mon.step_history.flush

        def flush(wait=True):
            t0 = time.thread_time()
            inner(wait)
            flush_s[0] += time.thread_time() - t0
        mon.step_history.flush = flush
    x = torch.randn(4, 16)
    with torch.no_grad():
        for _ in range(warmup):
            model(x)
        flush_s[0] = 0.0
        t0 = time.thread_time()
        for _ in range(steps):
            model(x)
        spent = time.thread_time() - t0
    mon.remove()
    return 1e3 * spent / steps, 1e3 * flush_s[0] / steps


def timing(a):
    model = model_of(a.targets)
    on, off, flush = [], [], []
    for _ in range(a.rounds):  # interleaved, so that a change of machine load hits both
        ms, fl = timed_round(model, True, a.time_steps)
        on.append(ms)
        flush.append(fl)
        off.append(timed_round(model, False, a.time_steps)[0])
    added = [h - n for h, n in zip(on, off)]

    def summary(xs):
        return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3), "max": round(max(xs), 3)}
    return {"targets": a.targets, "steps_per_round": a.time_steps, "rounds": a.rounds,
            "ms_per_step_history": summary(on), "ms_per_step_no_history": summary(off),
            "ms_per_step_added": summary(added), "ms_per_step_in_flush": summary(flush),
            "loadavg": open("/proc/loadavg").read().split()[:3]}


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--targets", type=int, default=400)
    p.add_argument("--keep", type=int, default=1000)
    p.add_argument("--steps", type=int, default=1100)
    p.add_argument("--time", action="store_true", help="measure host time per step instead of memory")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--time-steps", type=int, default=200)
    a = p.parse_args()
    torch.set_num_threads(1)
    out = timing(a) if a.time else memory(a)
    print(json.dumps({"hookstats": hookstats.__file__, **out}))


if __name__ == "__main__":
    main()
