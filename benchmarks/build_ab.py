"""Two builds of the CPU op side by side: ns per value of hookstats.accumulate_ from two checkouts (each with
its own hookstats/_C.so, each run in processes of its own, PYTHONPATH set to it), one torch thread, the thread's CPU
time, the builds interleaved (alternating which goes first), medians of the rounds and their spread.

    PYTHONPATH=. python benchmarks/build_ab.py --before /path/to/old/checkout --after .
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

import torch

CONFIGS = {  # StatsConfig keywords: the default (float buckets: the one-pass loops) and both fixed histograms
    "float buckets (default)": {},
    "linear + log2": {"linear_hist": True, "log_hist": True, "float_hist": False},
}


def measure(dtypes, sizes, min_seconds):
    """{"dtype values config": ns per value} in this process's build."""
    from op_throughput import fresh_state, time_call

    from hookstats import accumulate
    from hookstats.config import StatsConfig
    from hookstats.tools import bench
    torch.set_num_threads(1)
    bench.set_clock("cpu")
    out = {}
    for dtype in dtypes:
        for n in sizes:
            x = torch.randn(n, generator=torch.Generator().manual_seed(0)).to(dtype)
            for name, kw in CONFIGS.items():
                cfg = StatsConfig(**kw)
                f, i, s = fresh_state(cfg)
                on = torch.ones(1, dtype=torch.bool)
                call = (lambda f, i, s, p: lambda x: accumulate.accumulate_(x, f, i, s, on, p))(f, i, s, cfg.op_params())
                call(x)
                t = statistics.median(time_call(call, x, min_seconds) for _ in range(5))
                out[f"{str(dtype)[6:]} {n} {name}"] = t / n * 1e9
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--before", required=True, help="checkout whose hookstats/_C.so is the baseline")
    p.add_argument("--after", required=True)
    p.add_argument("--dtypes", default="float32,bfloat16,float64")
    p.add_argument("--sizes", default="65536,1048576", help="values, comma list")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--min-seconds", type=float, default=0.05)
    p.add_argument("--one-build", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    dtypes = [getattr(torch, d) for d in a.dtypes.split(",")]
    sizes = [int(s) for s in a.sizes.split(",")]
    if a.one_build:
        print(json.dumps(measure(dtypes, sizes, a.min_seconds)))
        return
    here = os.path.dirname(os.path.abspath(__file__))
    builds = {"before": os.path.abspath(a.before), "after": os.path.abspath(a.after)}
    runs = {k: [] for k in builds}
    for r in range(a.rounds):
        for k in (list(builds) if r % 2 == 0 else list(builds)[::-1]):
            env = {**os.environ, "PYTHONPATH": builds[k] + os.pathsep + here}
            res = subprocess.run([sys.executable, os.path.join(here, "build_ab.py"), "--one-build", "--before", ".",
                                  "--after", ".", "--dtypes", a.dtypes, "--sizes", a.sizes, "--min-seconds",
                                  str(a.min_seconds)], env=env, capture_output=True, text=True, check=True, cwd=builds[k])
            runs[k].append(json.loads(res.stdout.strip().splitlines()[-1]))
    print(f"ns/value, 1 thread, thread CPU time, median (min-max) of {a.rounds} interleaved rounds; after/before: "
          "the time ratio (< 1: faster)")
    print("| case | before | after | after/before |\n|---|---|---|---|")
    for case in runs["before"][0]:
        b = [x[case] for x in runs["before"]]
        t = [x[case] for x in runs["after"]]
        mb, ma = statistics.median(b), statistics.median(t)
        print(f"| {case} | {mb:.3f} ({min(b):.3f}-{max(b):.3f}) | {ma:.3f} ({min(t):.3f}-{max(t):.3f}) | {ma / mb:.3f} |")


if __name__ == "__main__":
    main()
