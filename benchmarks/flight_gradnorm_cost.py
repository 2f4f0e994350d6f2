"""What the flight recorder (AlertRules(flight=K)) and the gradient norms (derived at each flush from the parameter
gradients) add to a CPU training step with the history on: one torch thread, the thread's CPU clock, one model copy
per variant stepped in rounds (every variant runs `--steps` steps a round, the order rotated), per variant the median
of the per-round ratios to "history, param_grads" with the derivation of the gradient norms switched off. No alert
fires: that is the steady state (a flight costs one host assembly in the flush that raises it). Writes
benchmarks/results/flight_gradnorm_cost.json (results_file.py's shape), which docs/performance.md shows.

    PYTHONPATH=. python benchmarks/flight_gradnorm_cost.py --workload cnn --rounds 12 --steps 10
"""
import argparse
import json
import os
import statistics
import time

import results_file

import torch

import hookstats
from hookstats import delivery
from hookstats.tools.bench.models import make_workload

BASE = "history, param_grads, no grad norms"
VARIANTS = {
    BASE: {},
    "+ grad norms (clip_norm=1.0)": {"clip_norm": 1.0},
    "+ grad norms + flight=32": {"clip_norm": 1.0, "alerts": hookstats.AlertRules(flight=32)},
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="cnn")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", default=os.path.join(results_file.ROOT, "benchmarks", "results", "flight_gradnorm_cost.json"))
    args = ap.parse_args()
    load = os.getloadavg()[0]
    torch.set_num_threads(1)
    runs = {}
    for name, kw in VARIANTS.items():
        model, step = make_workload(args.workload)
        mon = hookstats.attach(model, param_grads=True, history=True, log_every=10, **kw)
        runs[name] = (step, mon)
        step()
    names = list(runs)
    times = {n: [] for n in names}
    for r in range(args.rounds):
        for n in names[r % len(names):] + names[: r % len(names)]:
            step = runs[n][0]
            derive = n != BASE
            saved = delivery.PARAM_GRAD
            delivery.PARAM_GRAD = saved if derive else "(none)"  # the base: the flush derives no norms
            t0 = time.thread_time()
            for _ in range(args.steps):
                step()
            times[n].append((time.thread_time() - t0) / args.steps)
            delivery.PARAM_GRAD = saved
    results = {}
    for n in names:
        ratios = [t / b for t, b in zip(times[n], times[BASE])]
        q1, _, q3 = statistics.quantiles(ratios, n=4)
        results[f"{args.workload}: {n}"] = {"step_ms": 1e3 * statistics.median(times[n]),
                                            "ratio": statistics.median(ratios), "ratio_q1": q1, "ratio_q3": q3,
                                            "rounds": args.rounds}
    for _, mon in runs.values():
        mon.remove()
    data = results_file.write(args.out, results, results_file.machine(load_start=load)
                              + f", {args.steps} steps a round")
    print(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
