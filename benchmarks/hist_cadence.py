"""The histogram cadence (StatsConfig.hist_every) on CPU: per N, the fused op's own time per step (a clock around
each call) and the step time against no hooks, interleaved with histograms off, over a whole number of cadences.
The default N is chosen from this (docs/performance.md, "The histogram cadence").
    python benchmarks/hist_cadence.py --workloads cnn,transformer [--repeats 3 --json out.json]"""
import argparse
import os
import statistics

import results_file
import torch

from hookstats import accumulate
from hookstats.tools import bench

CADENCES = (1, 4, 5, 10)
OFF = bench.NO_HISTOGRAMS


def variants():
    """(label, attach() keywords or None for no hooks)."""
    return [("no hooks", None), *((f"hist_every={n}", {"hist_every": n}) for n in CADENCES), ("histograms off", OFF)]


def measure(workload, repeats=3, steps=20, warmup=2):
    """{label: {"step_ms", "op_ms", "ratio", "ratio_min", "ratio_max"}}: medians over the repeats, each repeat every
    variant once (rotated order); `steps` a multiple of every N, so each run holds steps / N histogram steps."""
    model, step = bench.make_workload(workload)
    spent = [0.0]
    timed, real = bench.timed_ops(spent)
    labels = variants()
    runs = {label: [] for label, _ in labels}
    for r in range(repeats):
        for label, config in labels[r % len(labels):] + labels[: r % len(labels)]:
            inst = bench.install_hookstats(model, **config) if config is not None else bench.Installed()
            accumulate.accumulate_, accumulate.accumulate_many_ = timed
            try:
                for _ in range(warmup):
                    step()
                    inst.after_step()
                spent[0] = 0.0
                per_step = bench.time_steps(step, inst.after_step, steps)
            finally:
                accumulate.accumulate_, accumulate.accumulate_many_ = real
                inst.remove()
            runs[label].append((per_step * 1e3, spent[0] / steps * 1e3))
    base = [s for s, _ in runs["no hooks"]]
    out = {}
    for label, rs in runs.items():
        ratios = [s / b for (s, _), b in zip(rs, base)]
        out[label] = {"step_ms": statistics.median(s for s, _ in rs), "op_ms": statistics.median(o for _, o in rs),
                      "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workloads", default="cnn,transformer")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=20, help="timed steps per run (a multiple of every N)")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    bench.set_clock("cpu")
    load = os.getloadavg()[0]
    res = {}
    for w in a.workloads.split(","):
        res[w] = measure(w, a.repeats, a.steps)
        print(f"{w}: {'variant':<16} {'step ms':>8} {'op ms':>7} {'ratio':>6} [min..max]")
        for label, v in res[w].items():
            print(f"{w}: {label:<16} {v['step_ms']:8.1f} {v['op_ms']:7.2f} {v['ratio']:6.3f} "
                  f"[{v['ratio_min']:.3f}..{v['ratio_max']:.3f}]", flush=True)
    if a.json:
        results_file.write(a.json, {f"{w}: {label}": v for w, rows in res.items() for label, v in rows.items()},
                           results_file.machine(load_start=load), argv)


if __name__ == "__main__":
    main()
