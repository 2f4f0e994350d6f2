"""What a monitored CPU training step costs beside the floor and split into its parts. The floor: the user's own
forward hooks doing `o.sum()` on each output and `g.sum()` on the gradient into it (each value read once), on the
modules hookstats hooks; beside it `attach(model)` as it is (outputs and their gradients, histograms every
`hist_every` steps) and with histograms off. Then the split, all with parameter gradients measured too: the hooks
alone (the op replaced by a no-op), the hooks with `x.sum()` in place of the op, the op without histograms, the
defaults and every step's histograms. One model copy per variant, stepped round-robin (one step each, rotated
order), one torch thread, the thread's CPU clock; per variant the median of the per-round ratios to no hooks and
their IQR. "defaults over the floor" is (attach's ratio - 1) / (the floor's ratio - 1) from those medians, with
the IQR of that figure over 1000 resamplings of the rounds, and the ms a step beyond the floor.

glibc's malloc returns the freed heap top and large blocks to the kernel and faults them in again, a few thousand
page faults a step on the CNN that come and go with the order of frees (4,000-9,000 a step with or without
hooks): ±5% from step to step. The script runs itself under fixed mallopt settings (environment below), so that
every variant allocates from a heap that stays mapped; --glibc-defaults leaves them out.

    PYTHONPATH=. python benchmarks/step_floor.py --workload cnn --rounds 60
    (writes benchmarks/results/step_floor_cnn.json; --json names another file)
"""
import argparse
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import time

import results_file
import torch

from hookstats.tools.bench import NO_HISTOGRAMS

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hook_overhead import install_floor  # noqa: E402  (the floor's hooks, shared with hook_overhead.py)

STABLE_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(2 ** 32), "MALLOC_TRIM_THRESHOLD_": str(2 ** 34),
                 "MALLOC_TOP_PAD_": str(2 ** 28)}
# label: attach() keywords (None: no hooks), and what replaces the op ("noop", "sum" or None: the op itself). All
# but the first measured variant add param_grads=True to attach()'s defaults (outputs and their gradients), as
# `hookstats bench` does: every target measured each step.
PLAIN = "attach(model) as it is"
PLAIN_NO_HIST = "attach(model), histograms off"
FLOOR = "floor: own hooks, o.sum() + g.sum()"
VARIANTS = {
    "no hooks": (None, None),
    FLOOR: (None, "floor"),
    PLAIN: ({}, None),
    PLAIN_NO_HIST: (NO_HISTOGRAMS, None),
    "hooks, op a no-op": ({}, "noop"),
    "hooks, x.sum() for the op": ({}, "sum"),
    "op without histograms": (NO_HISTOGRAMS, None),
    "defaults (hist_every=10)": ({}, None),
    "histograms every step": ({"hist_every": 1}, None),
}


def install(model, label, kwargs, replace):
    import hookstats
    from hookstats.tools.bench.variants import hookstats_kwargs
    if replace == "floor":
        return install_floor(model)
    mon = hookstats.attach(model, **({} if label in (PLAIN, PLAIN_NO_HIST) else hookstats_kwargs()), **kwargs)
    if replace is not None:
        # the monitor's own hooks, the same calls; only what they call changes
        mon.store.accumulate = (lambda t, *a: t.sum()) if replace == "sum" else (lambda *a: None)
        mon.store.update = (lambda t, args: t.sum() is not None) if replace == "sum" else (lambda t, args: True)
        mon.store.accumulate_many = lambda *a, **k: None
    return mon


def quartiles(v):
    q = statistics.quantiles(v, n=4)
    return q[0], statistics.median(v), q[2]


def measure(workload, rounds, names=None, warmup=3):
    from hookstats.tools.bench.models import make_workload
    torch.set_num_threads(1)
    steps, monitors = {}, []
    for label, (kwargs, replace) in VARIANTS.items():
        if names and label not in names and label != "no hooks":
            continue
        model, step = make_workload(workload)
        steps[label] = step
        if kwargs is not None or replace is not None:
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
    ratios = {label: [t / b for t, b in zip(times[label], base)] for label in labels}
    out = {}
    for label in labels:
        q1, med, q3 = quartiles(ratios[label])
        out[label] = {"step_ms": round(1000 * statistics.median(times[label]), 3), "ratio": round(med, 4),
                      "ratio_q1": round(q1, 4), "ratio_q3": round(q3, 4),
                      "faults_per_step": [min(faults[label]), statistics.median(faults[label]), max(faults[label])]}
    for label in (PLAIN, PLAIN_NO_HIST):
        if label in times and FLOOR in times:
            out[f"{label}: overhead over the floor's"] = over_floor(ratios[label], ratios[FLOOR], times[label],
                                                                   times[FLOOR])
    return out


def over_floor(r, rf, t, tf, resamples=1000):
    """(median ratio - 1) / (floor's median ratio - 1), its IQR over resampled rounds, and ms beyond the floor."""
    def of(idx):
        f = statistics.median(rf[i] for i in idx) - 1
        return (statistics.median(r[i] for i in idx) - 1) / f if f > 0 else float("nan")
    rng = random.Random(0)
    n = len(r)
    boot = sorted(of([rng.randrange(n) for _ in range(n)]) for _ in range(resamples))
    q1, _, q3 = quartiles(boot)
    beyond = quartiles([1e3 * (a - b) for a, b in zip(t, tf)])
    return {"step_ms": round(beyond[1], 3), "ratio": round(of(range(n)), 3), "ratio_q1": round(q1, 3),
            "ratio_q3": round(q3, 3), "ms_beyond_floor_q1": round(beyond[0], 3), "ms_beyond_floor_q3": round(beyond[2], 3)}


def commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or None
    except OSError:
        return None


def machine():
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), platform.machine())
    except OSError:
        model = platform.machine()
    return f"{model}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="cnn")
    ap.add_argument("--rounds", type=int, default=60, help="steps per variant")
    ap.add_argument("--variants", nargs="+", choices=list(VARIANTS), help="a subset (no hooks is always run)")
    ap.add_argument("--glibc-defaults", action="store_true", help="leave malloc's settings as they are")
    ap.add_argument("--json", help="default: benchmarks/results/step_floor_<workload>.json")
    args = ap.parse_args()
    if not args.glibc_defaults and any(os.environ.get(k) != v for k, v in STABLE_MALLOC.items()):
        sys.exit(subprocess.call([sys.executable, *sys.argv], env={**os.environ, **STABLE_MALLOC}))
    load = os.getloadavg()
    res = measure(args.workload, args.rounds, args.variants)
    print(f"{args.workload}: {args.rounds} steps per variant, load {load[0]:.1f} -> {os.getloadavg()[0]:.1f}, "
          f"malloc {'glibc defaults' if args.glibc_defaults else 'fixed (STABLE_MALLOC)'}")
    for label, r in res.items():
        extra = f"  page faults a step {r['faults_per_step'][1]:.0f}" if "faults_per_step" in r else \
            "  (step_ms: ms a step beyond the floor)"
        print(f"  {label:50s} {r['step_ms']:8.2f} ms  {r['ratio']:.3f} [{r['ratio_q1']:.3f}..{r['ratio_q3']:.3f}]{extra}")
    path = args.json or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                     f"step_floor_{args.workload}.json")
    with open(path, "w") as f:
        json.dump({"machine": machine(), "torch": torch.__version__, "commit": commit(),
                   "command": "PYTHONPATH=. python benchmarks/step_floor.py " + " ".join(sys.argv[1:]),
                   "threads": torch.get_num_threads(), "rounds": args.rounds,
                   "kernel": os.environ.get("HOOKSTATS_CPU_KERNEL", "default"),
                   "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                   "load": [load[0], os.getloadavg()[0]], "results": res}, f, indent=1)


if __name__ == "__main__":
    main()
