"""Where hookstats' step overhead goes (histograms on and off,
interleaved with no hooks and fastai; the op's own time inside the step), and RSS over 60 steps for no
hooks, hookstats and fastai."""
import argparse
import json
import statistics

import results_file
import torch

from hookstats.tools import bench


def histograms_off(workload="cnn", repeats=4, steps=4):
    vs = ["no hooks", "hookstats", "hookstats (histograms off)", "fastai ActivationStats"]
    t = bench.interleaved_step_times(workload, vs, repeats=repeats, steps=steps)
    return {f"{workload}: {v}": bench.summarize(t[v], t["no hooks"]) for v in vs}


def op_time(workload="cnn", steps=6, warmup=2, repeats=3):
    """Milliseconds per step spent inside the fused op (clock around each call, every target on), with both
    histograms and without, against the step time of the same runs and of a monitor whose op does nothing
    (what the hooks cost without the op)."""
    from hookstats import accumulate
    model, step = bench.make_workload(workload)
    spent = [0.0]
    timed, real = bench.timed_ops(spent)

    def run(config):
        inst = bench.install_hookstats(model, **config) if config is not None else bench.Installed()
        try:
            for _ in range(warmup):
                step()
            spent[0] = 0.0
            per_step = bench.time_steps(step, inst.after_step, steps)
        finally:
            inst.remove()
        return {"step_ms": per_step * 1e3, "op_ms": spent[0] / steps * 1e3}

    samples = {}
    for _ in range(repeats):  # interleaved: every variant once per repeat
        samples.setdefault("no hooks", []).append(run(None))
        for label, config, ops in (("both histograms", {}, timed),
                                   ("histograms off", bench.NO_HISTOGRAMS, timed),
                                   ("op does nothing", {}, [lambda *a: None] * 2)):
            accumulate.accumulate_, accumulate.accumulate_many_ = ops
            try:
                samples.setdefault(label, []).append(run(config))
            finally:
                accumulate.accumulate_, accumulate.accumulate_many_ = real
    out = {}
    for label, runs in samples.items():  # medians, and the step time as a ratio to no hooks of the same repeat
        out[label] = {k: statistics.median(r[k] for r in runs) for k in ("step_ms", "op_ms")}
        out[label]["ratio"] = statistics.median(r["step_ms"] / b["step_ms"] for r, b in zip(runs, samples["no hooks"]))
        out[label]["op_share_of_no_hooks_step"] = out[label]["op_ms"] / out["no hooks"]["step_ms"]
    return {f"{workload}: {label}": r for label, r in out.items()}


def memory_long(workload="cnn", steps=60):
    vs = ("no hooks", "hookstats", "fastai ActivationStats")
    out = {}
    for v in vs:
        m = bench.measure_memory(workload, v, steps, list(range(10, steps + 1, 10)))
        out[f"{workload}: {v}"] = {"peak_rss_mb": m["peak_rss"] / 1e6, "monitor_bytes": m["monitor_bytes"],
                                   **{f"rss_mb_after_{k}": b / 1e6 for k, b in m["rss"].items()}}
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", choices=["histograms-off", "memory-long", "op-time"])
    p.add_argument("--workload", default="cnn", help="op-time: cnn or transformer")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--clock", default="cpu", choices=list(bench.CLOCKS))
    p.add_argument("--json", default=None, help="output file (default: benchmarks/results/<what>.json)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    bench.set_clock(a.clock)
    if a.what == "histograms-off":
        res, path = histograms_off(), "benchmarks/results/histograms_off.json"
    elif a.what == "op-time":
        res, path = op_time(a.workload), f"benchmarks/results/op_time_{a.workload}.json"
    else:
        res, path = memory_long(), "benchmarks/results/memory_long_cnn.json"
    clock = "the thread's CPU clock" if a.clock == "cpu" else "wall clock"
    results_file.write(a.json or path, res, results_file.machine(clock), argv)
    print(json.dumps(res, indent=1)[:3000])


if __name__ == "__main__":
    main()
