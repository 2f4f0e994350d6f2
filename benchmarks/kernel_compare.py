"""The CPU kernels side by side: ns per value of the op, portable
kernel (HOOKSTATS_CPU_KERNEL=portable, each kernel in a process of its own) against the AVX2 one, with no
histograms, the linear one, linear + log2 (no float buckets) and the float buckets
alone, beside x.sum() on the same tensor: 16 MB of N(0, 1), one torch thread, the thread's CPU time, the
variants interleaved, medians of the rounds.

    PYTHONPATH=. python benchmarks/kernel_compare.py
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

import torch
from op_throughput import fresh_state, time_call

from hookstats import accumulate
from hookstats.tools import bench
from hookstats.config import StatsConfig

CONFIGS = {
    "no histograms": StatsConfig(linear_hist=False, log_hist=False, float_hist=False),
    "linear histogram": StatsConfig(linear_hist=True, log_hist=False, float_hist=False),
    "both histograms": StatsConfig(linear_hist=True, log_hist=True, float_hist=False),
    "float buckets alone": StatsConfig(linear_hist=False, log_hist=False, float_hist=True),
}
SUM = "x.sum()"


def op_call(cfg):
    f, i, s = fresh_state(cfg)
    on = torch.ones(1, dtype=torch.bool)
    return lambda x: accumulate.accumulate_(x, f, i, s, on, cfg.op_params())


def measure(dtypes, nbytes, rounds, min_seconds):
    """{dtype: {variant: ns per value}} in this process's kernel."""
    fns = {SUM: lambda x: x.sum(), **{k: op_call(c) for k, c in CONFIGS.items()}}
    names = list(fns)
    out = {}
    for dtype in dtypes:
        x = torch.randn(nbytes // torch.tensor([], dtype=dtype).element_size(), generator=torch.Generator().manual_seed(0))
        x = x.to(dtype)
        t = {n: [] for n in names}
        for r in range(rounds):
            for n in names[r % len(names):] + names[: r % len(names)]:
                t[n].append(time_call(fns[n], x, min_seconds))
        out[str(dtype).replace("torch.", "")] = {n: statistics.median(v) / x.numel() * 1e9 for n, v in t.items()}
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--mb", type=int, default=16)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--min-seconds", type=float, default=0.05)
    p.add_argument("--one-kernel", action="store_true", help="measure this process's kernel only, print JSON")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    bench.set_clock("cpu")
    if a.one_kernel:
        print(json.dumps({"kernel": torch.ops.hookstats.cpu_kernel(),
                          "ns": measure([getattr(torch, d) for d in a.dtypes.split(",")], a.mb << 20, a.rounds,
                                        a.min_seconds)}))
        return
    here = os.path.dirname(os.path.abspath(__file__))
    runs = {}
    for kernel in ("portable", "avx2"):
        env = {**os.environ, "HOOKSTATS_CPU_KERNEL": kernel}
        r = subprocess.run([sys.executable, os.path.join(here, "kernel_compare.py"), "--one-kernel", "--dtypes", a.dtypes,
                            "--mb", str(a.mb), "--rounds", str(a.rounds), "--min-seconds", str(a.min_seconds)],
                           env=env, capture_output=True, text=True, check=True)
        runs[kernel] = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"{a.mb} MB, N(0, 1), 1 thread, thread CPU time, ns/value, median of {a.rounds}; kernels: "
          + ", ".join(f"{k} -> {v['kernel']}" for k, v in runs.items()))
    print("| dtype | config | portable | AVX2 | speed-up | `x.sum()` |\n|---|---|---|---|---|---|")
    for dtype, after in runs["avx2"]["ns"].items():
        before = runs["portable"]["ns"][dtype]
        for c in CONFIGS:
            print(f"| {dtype} | {c} | {before[c]:.2f} | {after[c]:.2f} | {before[c] / after[c]:.1f}x | {after[SUM]:.2f} |")


if __name__ == "__main__":
    main()
