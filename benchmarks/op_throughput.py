"""The op alone: GB/s of hookstats.accumulate_ against x.sum() (one read:
the floor), fastai's ActivationStats hook (separate passes, three .item()), the reference path and
torch.compile of the reference, per dtype and tensor size. Variants interleaved, medians and spread."""
import argparse
import statistics

import results_file
import torch

from hookstats import accumulate, rawstate, reference
from hookstats.tools import bench
from hookstats.config import StatsConfig

SIZES = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
# Spelled out: the labels of the saved results (results/op_throughput*.json) predate the float buckets, when
# StatsConfig() meant both fixed histograms.
BOTH = StatsConfig(linear_hist=True, log_hist=True, float_hist=False)
CONFIGS = {
    "op, no histograms": StatsConfig(linear_hist=False, log_hist=False, float_hist=False),
    "op, linear histogram": StatsConfig(linear_hist=True, log_hist=False, float_hist=False),
    "op, both histograms": BOTH,
    "op, float buckets (the default)": StatsConfig(),
}


def fresh_state(cfg):
    f = rawstate.empty()
    return f, torch.zeros(cfg.istate_size, dtype=torch.int64), torch.zeros(0, dtype=torch.uint8)


def op_call(fn, cfg):
    f, i, s = fresh_state(cfg)
    on = torch.ones(1, dtype=torch.bool)
    args = cfg.op_params()
    return lambda x: fn(x, f, i, s, on, args)


def fastai_call(with_hist):
    from fastai.callback.hook import ActivationStats
    cb = ActivationStats(with_hist=with_hist)
    return lambda x: cb.hook(None, None, x)


def variants(compile_reference=True):
    v = {"x.sum()": lambda x: x.sum()}
    if accumulate.backend() == "compiled":
        for name, cfg in CONFIGS.items():
            v[name] = op_call(accumulate.accumulate_, cfg)
    try:
        v["fastai hook, no hist"] = fastai_call(False)
        v["fastai hook, with_hist"] = fastai_call(True)
    except ImportError:
        pass
    v["reference path, both histograms"] = op_call(reference.accumulate_, BOTH)
    if compile_reference:
        v["torch.compile(reference), both histograms"] = op_call(
            torch.compile(reference.accumulate_, dynamic=True), BOTH)
    return v


def time_call(fn, x, min_seconds=0.02):
    """Seconds per call (bench.clock): enough back-to-back calls to last min_seconds, at least one."""
    t0 = bench.clock()
    fn(x)
    t = bench.clock() - t0
    reps = max(1, min(1000, int(min_seconds / max(t, 1e-7))))
    if reps == 1:
        return t
    t0 = bench.clock()
    for _ in range(reps):
        fn(x)
    return (bench.clock() - t0) / reps


SLOW = ("fastai", "reference", "torch.compile")


def measure(dtypes, sizes, repeats, compile_reference=True, slow_max_bytes=None, log=print):
    """slow_max_bytes: the 100-1000x slower peers (fastai, reference) run up to this size only."""
    fns = variants(compile_reference)
    rows = []
    for dtype in dtypes:
        for nbytes in sizes:
            x = torch.randn(nbytes // torch.tensor([], dtype=dtype).element_size()).to(dtype)
            names = [n for n in fns if not (slow_max_bytes and nbytes > slow_max_bytes and n.startswith(SLOW))]
            for name in names:  # warm-up: compiles, first-touch of lazily allocated buffers
                fns[name](x)
            samples = {n: [] for n in names}
            for r in range(repeats):
                for name in names[r % len(names):] + names[: r % len(names)]:
                    samples[name].append(time_call(fns[name], x))
            for name in names:
                ratios = [s / t for s, t in zip(samples["x.sum()"], samples[name])]  # throughput / sum's
                rows.append({"dtype": str(dtype).replace("torch.", ""), "bytes": nbytes, "variant": name,
                             "median_s": statistics.median(samples[name]),
                             "gbps": nbytes / statistics.median(samples[name]) / 1e9,
                             "gbps_min": nbytes / max(samples[name]) / 1e9,
                             "gbps_max": nbytes / min(samples[name]) / 1e9,
                             "vs_sum": statistics.median(ratios)})
            log(f"{dtype} {nbytes >> 10} KB: " + ", ".join(
                f"{r['variant']} {r['gbps']:.2f}" for r in rows[-len(names):]))
    return rows


def markdown(rows, sizes_shown=None):
    """One table per dtype: GB/s median [min..max] and the ratio to x.sum() of the same repeats."""
    out = []
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        sub = [r for r in rows if r["dtype"] == dtype]
        sizes = sorted({r["bytes"] for r in sub} & set(sizes_shown or [r["bytes"] for r in sub]))
        names = list(dict.fromkeys(r["variant"] for r in sub))
        out.append(f"\n**{dtype}** (GB/s, median [min..max]; (x) = throughput / x.sum()'s, same repeats)\n")
        out.append("| variant | " + " | ".join(size_label(s) for s in sizes) + " |")
        out.append("|---|" + "---|" * len(sizes))
        for n in names:
            cells = []
            for s in sizes:
                r = next((r for r in sub if r["variant"] == n and r["bytes"] == s), None)
                cells.append("-" if r is None else
                             f"{r['gbps']:.2f} [{r['gbps_min']:.2f}..{r['gbps_max']:.2f}] ({r['vs_sum']:.3f}x)")
            out.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def size_label(b):
    return f"{b >> 20} MB" if b >= 1 << 20 else f"{b >> 10} KB"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--sizes", default=",".join(str(s) for s in SIZES), help="bytes, comma list")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile of the reference")
    p.add_argument("--slow-max-bytes", type=int, default=16 << 20,
                   help="largest size for fastai and the reference path (0: every size)")
    p.add_argument("--json", default="benchmarks/results/op_throughput.json")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, = cores)")
    p.add_argument("--clock", default="wall", choices=list(bench.CLOCKS),
                   help="cpu: the thread's CPU time, for a loaded shared machine (needs --threads 1)")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    bench.set_clock(a.clock)
    dtypes = [getattr(torch, d) for d in a.dtypes.split(",")]
    rows = measure(dtypes, [int(s) for s in a.sizes.split(",")], a.repeats, not a.no_compile, a.slow_max_bytes)
    clock = "the thread's CPU clock" if a.clock == "cpu" else "wall clock"
    results_file.write(a.json, {f"{r['variant']}, {r['dtype']} {size_label(r['bytes'])}":
                                {k: r[k] for k in ("gbps", "gbps_min", "gbps_max", "vs_sum")} for r in rows},
                       results_file.machine(clock), argv)
    print(markdown(rows))


if __name__ == "__main__":
    main()
