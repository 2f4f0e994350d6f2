"""The op with float buckets alone (FLOAT_HIST: the default) against x.sum(), against the old default op
(linear and log2 histograms, 40 bins) and without any histogram (flags 0), side by side in one run: one torch
thread, the thread's CPU time, variants interleaved in rotated order each round; medians of the per-round ratios
with their [min..max]. The CPU kernel is the best the CPU has; HOOKSTATS_CPU_KERNEL=avx2 (or portable) forces one.

    PYTHONPATH=. python benchmarks/float_hist_op.py            # fp32 and bf16 at 1, 4, 16, 64 and 256 MB
"""
import argparse
import os
import statistics
import subprocess

import results_file
import torch
from op_throughput import fresh_state, size_label, time_call

from hookstats import accumulate, layout
from hookstats.tools import bench
from hookstats.config import StatsConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUM = "x.sum()"
FLOAT = "op, FLOAT_HIST alone"
DEFAULT = "op, LINEAR_HIST|LOG_HIST (the old default)"
NO_HIST = "op, no histograms"


def op_call(cfg, flags):
    f, i, s = fresh_state(cfg)
    i = torch.zeros(layout.istate_size(cfg.nbins, flags), dtype=torch.int64)
    on = torch.ones(1, dtype=torch.bool)
    args = layout.op_params(*cfg.op_params()[:4], flags)
    return lambda x: accumulate.accumulate_(x, f, i, s, on, args)


OLD_DEFAULT = StatsConfig(linear_hist=True, float_hist=False)  # 40 bins, and the log2 slots


def variants():
    plain = StatsConfig(linear_hist=False, log_hist=False)
    return {SUM: lambda x: x.sum(), FLOAT: op_call(plain, layout.FLOAT_HIST),
            DEFAULT: op_call(OLD_DEFAULT, OLD_DEFAULT.flags), NO_HIST: op_call(plain, 0)}


def measure(dtypes, sizes, rounds, min_seconds, log=print):
    fns = variants()
    names = list(fns)
    rows = []
    for dtype in dtypes:
        for nbytes in sizes:
            x = torch.randn(nbytes // torch.tensor([], dtype=dtype).element_size()).to(dtype)
            for name in names:
                fns[name](x)
            t = {n: [] for n in names}
            for r in range(rounds):
                for name in names[r % len(names):] + names[: r % len(names)]:
                    t[name].append(time_call(fns[name], x, min_seconds))
            ratios = {"float_vs_sum": [s / f for s, f in zip(t[SUM], t[FLOAT])],
                      "float_speedup_vs_default": [d / f for d, f in zip(t[DEFAULT], t[FLOAT])],
                      "no_hist_vs_sum": [s / f for s, f in zip(t[SUM], t[NO_HIST])]}
            row = {"dtype": str(dtype).replace("torch.", ""), "bytes": nbytes,
                   "ns_per_value": {n: statistics.median(v) / x.numel() * 1e9 for n, v in t.items()},
                   **{k: {"median": statistics.median(v), "min": min(v), "max": max(v)} for k, v in ratios.items()}}
            rows.append(row)
            log(f"{row['dtype']} {size_label(nbytes)}: ns/value " + ", ".join(
                f"{n} {v:.3f}" for n, v in row["ns_per_value"].items()) + "; " + ", ".join(
                f"{k} {v['median']:.3f}" for k, v in ratios.items() for v in [row[k]]))
    return rows


def markdown(rows):
    out = ["| dtype | size | ns/value: x.sum() / FLOAT_HIST / old default / no hist | FLOAT_HIST throughput / "
           "x.sum()'s | FLOAT_HIST speed-up over the old default op | no histograms / x.sum() |", "|---|---|---|---|---|---|"]
    cell = lambda r: f"{r['median']:.2f}x [{r['min']:.2f}..{r['max']:.2f}]"  # noqa: E731
    for r in rows:
        ns = r["ns_per_value"]
        out.append(f"| {r['dtype']} | {size_label(r['bytes'])} | {ns[SUM]:.3f} / {ns[FLOAT]:.3f} / {ns[DEFAULT]:.3f} / "
                   f"{ns[NO_HIST]:.3f} | {cell(r['float_vs_sum'])} | {cell(r['float_speedup_vs_default'])} | "
                   f"{cell(r['no_hist_vs_sum'])} |")
    return "\n".join(out)


def uptime():
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def results(rows):
    """{"float32 16 MB": {field: value}}: ns per value of each variant, and the medians of the per-round ratios."""
    out = {}
    for r in rows:
        ns = r["ns_per_value"]
        out[f"{r['dtype']} {size_label(r['bytes'])}"] = {
            "sum_ns": ns[SUM], "float_hist_ns": ns[FLOAT], "no_hist_ns": ns[NO_HIST], "linear_log2_ns": ns[DEFAULT],
            "float_hist_vs_sum": r["float_vs_sum"]["median"], "no_hist_vs_sum": r["no_hist_vs_sum"]["median"],
            "float_hist_speedup": r["float_speedup_vs_default"]["median"]}
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--sizes-mb", default="1,4,16,64,256")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--min-seconds", type=float, default=0.05, help="back-to-back calls per timing")
    p.add_argument("--json", default=os.path.join(ROOT, "benchmarks/results/float_hist_op.json"))
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    bench.set_clock("cpu")
    load = os.getloadavg()[0]
    print(f"CPU kernel {torch.ops.hookstats.cpu_kernel()}; {uptime()}")
    rows = measure([getattr(torch, d) for d in a.dtypes.split(",")], [int(m) << 20 for m in a.sizes_mb.split(",")],
                   a.rounds, a.min_seconds)
    print(f"{uptime()}\n" + markdown(rows))
    results_file.write(a.json, results(rows), results_file.machine(load_start=load) +
                       f", CPU kernel {torch.ops.hookstats.cpu_kernel()}", argv)


if __name__ == "__main__":
    main()
