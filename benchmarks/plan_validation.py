"""Checks hookstats.plan() where it can be measured (CPU): its predicted step overhead for the benchmark CNN
and transformer against the measured one (interleaved rounds of no hooks and hookstats, per-round ratios),
the op time it predicts against the op's own time inside the step, its targets and memory against the real
monitor's; then how long planning the presets takes. Writes benchmarks/results/plan_validation.json."""
import argparse
import json
import resource
import statistics
import time
from pathlib import Path

import results_file
import torch
from torch.nn import functional as F

import hookstats
from hookstats import accumulate
from hookstats.tools import bench, op_speed, presets
from hookstats.tools.planner import plan

INPUTS = {"cnn": lambda: (torch.randn(64, 3, 32, 32),), "transformer": lambda: (torch.randint(0, 1000, (16, 128)),)}


def loss(out):
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), torch.zeros(out.numel() // out.shape[-1], dtype=torch.long))


def validate(workload, repeats, steps, warmup=2):
    model, step = bench.make_workload(workload)
    kwargs = bench.hookstats_kwargs()
    t0 = time.thread_time()
    speed = op_speed.MeasuredSpeed(hookstats.StatsConfig(), clock=bench.clock)
    p = plan(model, *INPUTS[workload](), loss_fn=loss, speed=speed, **kwargs)
    plan_cpu_s = time.thread_time() - t0
    for _ in range(warmup):
        step()
    base, hooked, op = [], [], []
    for r in range(repeats):  # interleaved: both variants each round, order alternating
        for variant in (("none", "hookstats") if r % 2 == 0 else ("hookstats", "none")):
            if variant == "none":
                bench.time_steps(step, lambda: None, warmup)
                base.append(bench.time_steps(step, lambda: None, steps))
                continue
            spent = [0.0]
            (one, many), real = bench.timed_ops(spent)
            accumulate.accumulate_, accumulate.accumulate_many_ = one, many
            mon = hookstats.attach(model, **kwargs)
            try:
                bench.time_steps(step, lambda: None, warmup)
                spent[0] = 0.0
                hooked.append(bench.time_steps(step, lambda: None, steps))
                op.append(spent[0] / steps)
                ids, memory = sorted(mon.stats()), mon.memory()
            finally:
                mon.remove()
                accumulate.accumulate_, accumulate.accumulate_many_ = real
    measured = [h / b - 1 for h, b in zip(hooked, base)]
    predicted = [p.op_seconds / b for b in base]  # the user's step time: this round's step without hooks
    med = statistics.median
    return {
        "targets_equal_attach": ids == sorted(t.id for t in p.targets), "targets": len(p.targets),
        "memory_equal": all(p.memory.get(k) == v for k, v in memory.items()), "memory": memory,  # (+ plan's bound)
        "values_per_step": p.values, "bytes_per_step": p.bytes,
        "op_seconds_per_call_measured": {str(k): dict(zip(speed.sizes, v)) for k, v in speed.points.items()},
        "plan_cpu_seconds": plan_cpu_s,
        "step_ms_no_hooks": [b * 1e3 for b in base], "step_ms_hookstats": [h * 1e3 for h in hooked],
        "op_ms_measured": [o * 1e3 for o in op], "op_ms_predicted": p.op_seconds * 1e3,
        "overhead_measured": measured, "overhead_predicted": predicted,
        "summary": {"overhead_measured_median": med(measured), "overhead_measured_min": min(measured),
                    "overhead_measured_max": max(measured), "overhead_predicted_median": med(predicted),
                    "error_points": med(pr - m for pr, m in zip(predicted, measured)),
                    "op_ms_measured_median": med(op) * 1e3, "op_ms_predicted": p.op_seconds * 1e3,
                    "op_time_error": p.op_seconds / med(op) - 1},
    }


def time_presets(names, seq):
    out = {}
    for name in names:
        t0, c0 = time.perf_counter(), time.process_time()
        model, inputs, kw = presets.build(name, seq=seq)
        p = plan(model, *inputs, example_kwargs=kw, speed="cuda", param_grads=True)
        out[name] = {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "targets": len(p.targets),
                     "bytes_per_step": p.bytes, "op_ms_h100": p.op_seconds * 1e3, "flops": p.flops,
                     "memory": p.memory, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workloads", nargs="+", default=["cnn", "transformer"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--presets", nargs="*", default=["gpt2", "llama-7b", "llama-70b"])
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "plan_validation.json"))
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    bench.set_clock("cpu")
    load = bench.loadavg()[0]
    res = {}
    for w in a.workloads:
        res[w] = validate(w, a.repeats, a.steps)
        print(w, json.dumps(res[w]["summary"]), "targets equal:", res[w]["targets_equal_attach"],
              "memory equal:", res[w]["memory_equal"], flush=True)
    presets_timed = time_presets(a.presets, a.seq)
    for name, r in presets_timed.items():
        print(name, {k: r[k] for k in ("wall_s", "cpu_s", "targets", "op_ms_h100", "peak_rss_mb")}, flush=True)
    results_file.write(a.out, table(res, presets_timed),
                       results_file.machine(load_start=load) + f", {a.repeats} rounds of {a.steps} steps", argv)


def table(workloads, presets_timed):
    """{"cnn": {plan against measurement}, "gpt2 (preset)": {what plan() predicts for it, and its CPU time}}."""
    out = {w: {"targets": r["targets"], "targets_equal_attach": r["targets_equal_attach"],
               "memory_equal": r["memory_equal"], "values_per_step": r["values_per_step"],
               "op_ms_predicted": r["summary"]["op_ms_predicted"], "op_ms_measured": r["summary"]["op_ms_measured_median"],
               "overhead_predicted": r["summary"]["overhead_predicted_median"],
               "overhead_measured": r["summary"]["overhead_measured_median"],
               "error_points": r["summary"]["error_points"] * 100} for w, r in workloads.items()}
    for name, r in presets_timed.items():
        out[f"{name} (preset)"] = {"targets": r["targets"], "gb_per_step": r["bytes_per_step"] / 1e9,
                                   "op_ms_h100": r["op_ms_h100"], "flops": r["flops"], "cpu_s": r["cpu_s"],
                                   "peak_rss_mb": r["peak_rss_mb"]}
    return out


if __name__ == "__main__":
    main()
