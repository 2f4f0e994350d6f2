"""The op's per-call cost on small CPU tensors (its fixed cost), beside the floor: a plain `t.sum()` on the same
tensor. float32 N(0, 1) tensors of 16, 256, 4096 and 65536 values; the default config (float buckets on) and one
with every histogram off; the eager hooks' entry (accumulate_eager, else torch.ops). One torch thread, the thread's
CPU clock, `--calls` calls per timing, the variants interleaved with the order rotated each round; each row gives
the median and IQR over rounds of the per-call time and of its per-round ratio to the floor. Timings on a shared
machine are noisy: use many rounds and compare ratios from one run.

    PYTHONPATH=. python benchmarks/op_fixed_cost.py --rounds 41
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

from hookstats import StatsConfig, accumulate, rawstate
from hookstats.tools.bench import NO_HISTOGRAMS

SIZES = (16, 256, 4096, 65536)
CONFIGS = {"default": StatsConfig(), "histograms off": StatsConfig(**NO_HISTOGRAMS)}


def quartiles(xs, digits=4):
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return round(q[1], digits), [round(q[0], digits), round(q[2], digits)]


def op_call(x, cfg):
    """One call of the op on x into a fresh state, as the eager hooks make it."""
    f, i = rawstate.empty(cfg.istate_size)
    s, on, args = torch.zeros(0, dtype=torch.uint8), torch.tensor([True]), cfg.op_params()
    eager, ops = accumulate.accumulate_eager_, accumulate.accumulate_
    if eager is not None and eager(x, f, i, s, on, args):
        return lambda: eager(x, f, i, s, on, args)
    return lambda: ops(x, f, i, s, on, args)


def variants():
    out = {}
    for n in SIZES:
        x = torch.randn(n, generator=torch.Generator().manual_seed(n))
        for name, cfg in CONFIGS.items():
            out[(n, name)] = op_call(x, cfg)
        out[(n, "floor")] = x.sum
    return out


def measure(rounds, calls):
    """{(n, variant): [us per call, one per round]}, variants interleaved, order rotated each round."""
    steps = variants()
    keys = list(steps)
    for step in steps.values():
        for _ in range(20):
            step()
    out = {k: [] for k in keys}
    for r in range(rounds):
        for k in keys[r % len(keys):] + keys[:r % len(keys)]:
            step, reps = steps[k], max(1, calls * 256 // max(256, k[0]))
            t0 = time.thread_time()
            for _ in range(reps):
                step()
            out[k].append(1e6 * (time.thread_time() - t0) / reps)
    return out


def commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except OSError:
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=41)
    ap.add_argument("--calls", type=int, default=200, help="calls per timing at <= 256 values (fewer above)")
    ap.add_argument("--json", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                   "op_fixed_cost.json"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    times = measure(a.rounds, a.calls)
    results = {}
    for (n, name), us in times.items():
        med, iqr = quartiles(us)
        row = {"numel": n, "us_per_call": med, "us_per_call_iqr": iqr}
        ratio = [u / f for u, f in zip(us, times[(n, "floor")])]  # the floor's own row: 1.0
        row["ratio_to_floor"], row["ratio_to_floor_iqr"] = quartiles(ratio, 3)
        results[f"n={n}, {name}" if name != "floor" else f"n={n}, floor (t.sum())"] = row
    out = {"machine": f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} CPUs".replace("  ", " "),
           "torch": torch.__version__, "commit": commit(), "command": " ".join(["python", *sys.argv]),
           "backend": accumulate.backend(), "cpu_kernel": torch.ops.hookstats.cpu_kernel()
           if accumulate.backend() == "compiled" else None, "threads": 1, "clock": "time.thread_time",
           "rounds": a.rounds, "load": os.getloadavg()[0], "results": results}
    print(json.dumps(results, indent=1))
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
