"""Step overhead of param_grads=True and params=True on the benchmark CNN and transformer: one torch thread, the
thread's CPU clock, variants interleaved (order rotated each round), median and IQR of per-round ratios to no
hooks. The floor: a plain optimizer post-hook reading each parameter once (p.sum(), no host read).
Writes benchmarks/results/param_overhead.json.
Run: PYTHONPATH=. python benchmarks/param_overhead.py [--rounds 15] [--steps 10]"""
import argparse
import os
import statistics
import time

import results_file
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

import hookstats
from hookstats.tools.bench import make_workload


def floor(model):
    params = list(model.parameters())

    def read(optimizer, args, kwargs):
        for p in params:
            p.detach().sum()
    h = register_optimizer_step_post_hook(read)
    return h.remove


def monitor(**kwargs):
    def install(model):
        return hookstats.attach(model, **kwargs).remove
    return install


VARIANTS = {
    "no hooks": lambda m: (lambda: None),
    "floor: read each parameter once per step": floor,
    "params only": monitor(outputs=False, grads=False, params=True),
    "param_grads only": monitor(outputs=False, grads=False, param_grads=True),
    "outputs + grads (defaults)": monitor(),
    "defaults + param_grads": monitor(param_grads=True),
    "defaults + params": monitor(params=True),
    "defaults + param_grads + params": monitor(param_grads=True, params=True),
}


def quartiles(xs):
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return q[0], q[1], q[2]


def run(workload, rounds, steps):
    model, step = make_workload(workload)
    for _ in range(2):
        step()
    names = list(VARIANTS)
    times = {v: [] for v in names}
    for r in range(rounds):
        for v in names[r % len(names):] + names[:r % len(names)]:
            remove = VARIANTS[v](model)
            try:
                for _ in range(2):
                    step()
                t0 = time.thread_time()
                for _ in range(steps):
                    step()
                times[v].append((time.thread_time() - t0) / steps)
            finally:
                remove()
    rows = {}
    for v in names:
        ratios = [t / b for t, b in zip(times[v], times["no hooks"])]
        q1, med, q3 = quartiles(ratios)
        rows[v] = {"median_ms": statistics.median(times[v]) * 1e3, "ratio": med, "ratio_q1": q1, "ratio_q3": q3,
                   "ratios": ratios}
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workloads", default="cnn,transformer")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "param_overhead.json"))
    a = p.parse_args()
    torch.set_num_threads(1)
    load = os.getloadavg()[0]
    results = {}
    for w in a.workloads.split(","):
        results[w] = run(w, a.rounds, a.steps)
        for v, r in results[w].items():
            print(f"{w:12} {v:40} {r['median_ms']:8.1f} ms  {r['ratio']:.3f}x [IQR {r['ratio_q1']:.3f}..{r['ratio_q3']:.3f}]",
                  flush=True)
        results_file.write(a.out, table(results), results_file.machine(load_start=load) + f", {a.steps} steps a round")


def table(results):
    """{"cnn: params only": {"step_ms", "ratio", "ratio_q1", "ratio_q3", "rounds"}}."""
    return {f"{w}: {v}": {"step_ms": r["median_ms"], "ratio": r["ratio"], "ratio_q1": r["ratio_q1"],
                          "ratio_q3": r["ratio_q3"], "rounds": len(r["ratios"])}
            for w, rows in results.items() for v, r in rows.items()}


if __name__ == "__main__":
    main()
