"""What a monitored CPU training step costs, split into its floors: the hooks alone (the op replaced by a no-op),
the hooks with `x.sum()` in place of the op (reading every measured value once, the least any exact statistic
costs), the op without histograms, and the defaults (float buckets every `hist_every` sampled steps) and every
step's histograms, all with parameter gradients measured too; and attach(model) as it is (outputs and their
gradients). One model copy per variant, stepped round-robin (one step each, rotated order), one torch
thread, the thread's CPU clock; the ratios are medians over blocks of 10 steps of (variant's time / no hooks'
time) with their [min..max].

glibc's malloc returns the freed heap top and large blocks to the kernel and faults them in again, a few thousand
page faults a step on the CNN that come and go with the order of frees (4,000-9,000 a step with or without
hooks): ±5% from step to step. The script runs itself under fixed mallopt settings (environment below), so that
every variant allocates from a heap that stays mapped; --glibc-defaults leaves them out.

    PYTHONPATH=. python benchmarks/step_floor.py --workload cnn --rounds 80 [--json out.json]
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch

from hookstats.tools.bench import NO_HISTOGRAMS

STABLE_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(2 ** 32), "MALLOC_TRIM_THRESHOLD_": str(2 ** 34),
                 "MALLOC_TOP_PAD_": str(2 ** 28)}
# label: attach() keywords (None: no hooks), and what replaces the op ("noop", "sum" or None: the op itself). All
# but the first measured variant add param_grads=True to attach()'s defaults (outputs and their gradients), as
# `hookstats bench` does: every target measured each step.
PLAIN = "attach(model) as it is"
VARIANTS = {
    "no hooks": (None, None),
    PLAIN: ({}, None),
    "hooks, op a no-op": ({}, "noop"),
    "hooks, x.sum() for the op": ({}, "sum"),
    "op without histograms": (NO_HISTOGRAMS, None),
    "defaults (hist_every=10)": ({}, None),
    "histograms every step": ({"hist_every": 1}, None),
}


def install(model, label, kwargs, replace):
    import hookstats
    from hookstats.tools.bench.variants import hookstats_kwargs
    mon = hookstats.attach(model, **({} if label == PLAIN else hookstats_kwargs()), **kwargs)
    if replace is not None:
        # the monitor's own hooks, the same calls; only what they call changes
        mon.store.accumulate = (lambda t, *a: t.sum()) if replace == "sum" else (lambda *a: None)
        mon.store.update = (lambda t, args: t.sum() is not None) if replace == "sum" else (lambda t, args: True)
        mon.store.accumulate_many = lambda *a, **k: None
    return mon


def measure(workload, rounds, warmup=3):
    from hookstats.tools.bench.models import make_workload
    torch.set_num_threads(1)
    steps, monitors = {}, []
    for label, (kwargs, replace) in VARIANTS.items():
        model, step = make_workload(workload)
        steps[label] = step
        if kwargs is not None:
            monitors.append(install(model, label, kwargs, replace))
    for step in steps.values():
        for _ in range(warmup):
            step()
    labels = list(steps)
    times = {label: [] for label in labels}
    faults = {label: [] for label in labels}  # minor page faults of the process during the step (one thread runs)
    for r in range(rounds):
        for label in labels[r % len(labels):] + labels[:r % len(labels)]:
            f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.thread_time()
            steps[label]()
            times[label].append(time.thread_time() - t0)
            faults[label].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    base = times["no hooks"]
    out = {}
    for label in labels:
        blocks = [sum(times[label][i:i + 10]) / sum(base[i:i + 10]) for i in range(0, rounds - 9, 10)]
        out[label] = {"step_ms": 1000 * statistics.median(times[label]), "ratio": statistics.median(blocks),
                      "ratio_min": min(blocks), "ratio_max": max(blocks),
                      "faults_per_step": [min(faults[label]), statistics.median(faults[label]), max(faults[label])]}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="cnn")
    ap.add_argument("--rounds", type=int, default=80, help="steps per variant (a multiple of 10)")
    ap.add_argument("--glibc-defaults", action="store_true", help="leave malloc's settings as they are")
    ap.add_argument("--json")
    args = ap.parse_args()
    if not args.glibc_defaults and any(os.environ.get(k) != v for k, v in STABLE_MALLOC.items()):
        sys.exit(subprocess.call([sys.executable, *sys.argv], env={**os.environ, **STABLE_MALLOC}))
    load = os.getloadavg()
    res = measure(args.workload, args.rounds)
    print(f"{args.workload}: {args.rounds} steps per variant, load {load[0]:.1f} -> {os.getloadavg()[0]:.1f}, "
          f"malloc {'glibc defaults' if args.glibc_defaults else 'fixed (STABLE_MALLOC)'}")
    for label, r in res.items():
        lo, med, hi = r["faults_per_step"]
        print(f"  {label:28s} {r['step_ms']:8.2f} ms  {r['ratio']:.3f} [{r['ratio_min']:.3f}..{r['ratio_max']:.3f}]"
              f"  page faults a step {med:.0f} [{lo}..{hi}]")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"workload": args.workload, "rounds": args.rounds, "glibc_defaults": args.glibc_defaults,
                       "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "load": [load[0], os.getloadavg()[0]], "results": res}, f, indent=1)


if __name__ == "__main__":
    main()
