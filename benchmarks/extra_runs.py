"""Two follow-up runs quoted in RESULTS.md: where hookstats' step overhead goes (histograms on and off,
interleaved with no hooks and fastai), and RSS over 60 steps for no hooks, hookstats and fastai."""
import argparse
import json

import torch

from hookstats import bench


def histograms_off(workload="cnn", repeats=4, steps=4):
    vs = ["no hooks", "hookstats", "hookstats (histograms off)", "fastai ActivationStats"]
    t = bench.interleaved_step_times(workload, vs, repeats=repeats, steps=steps)
    return {workload: {v: bench.summarize(t[v], t["no hooks"]) for v in vs}, "machine": bench.machine()}


def memory_long(workload="cnn", steps=60):
    vs = ("no hooks", "hookstats", "fastai ActivationStats")
    return {v: bench.measure_memory(workload, v, steps, list(range(10, steps + 1, 10))) for v in vs}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", choices=["histograms-off", "memory-long"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--clock", default="cpu", choices=list(bench.CLOCKS))
    p.add_argument("--json", default=None, help="output file (default: benchmarks/results/<what>.json)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    bench.set_clock(a.clock)
    if a.what == "histograms-off":
        res, path = histograms_off(), "benchmarks/results/histograms_off.json"
    else:
        res, path = memory_long(), "benchmarks/results/memory_long_cnn.json"
    with open(a.json or path, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res, indent=1)[:3000])


if __name__ == "__main__":
    main()
