"""What a training step costs with one checkout of hookstats against another: per-step CPU time (time.thread_time,
one torch thread) of the benchmark CNN and transformer with no hooks, the floor (your own hooks doing o.sum() on
each output and g.sum() on the gradient into it), `attach(model)` and `attach(model, history=True)` (log_every's
default, so the timed steps include the flushes) of each checkout. Two versions of the package cannot share a
process (both register the same torch ops): every variant runs in its own worker process, a fresh set of workers
each round, each warmed up for 3 steps and then timed over `--steps` steps (a multiple of
log_every: the same number of flushes in every window), the order of the variants rotated each round and reversed
every other round. Per pair (new/old defaults, new/old history) the median of the per-round ratios, with their
IQR and min..max. Writes benchmarks/results/version_step_cost.json (results_file.py's shape).

  git worktree add /tmp/base <old commit> && cp hookstats/_C*.so /tmp/base/hookstats/   (the old op, built there)
  PYTHONPATH=. python benchmarks/version_step_cost.py --old /tmp/base --new . [--rounds 8 --steps 10]
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import results_file  # noqa: E402
import worker_pipe  # noqa: E402
from worker_pipe import git_commit  # noqa: E402

# glibc returns the freed heap top to the kernel and faults it in again: thousands of page faults a step that come
# and go with the order of frees. Every worker allocates from a heap that stays mapped (as step_floor.py does).
STABLE_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(2 ** 32), "MALLOC_TRIM_THRESHOLD_": str(2 ** 34),
                 "MALLOC_TOP_PAD_": str(2 ** 28)}
LOG_EVERY = 10  # attach()'s default in both checkouts: any LOG_EVERY steps in a row hold one flush
WARMUP = 3


def worker(path, workload, kind, attach_kwargs):
    """kind: "none", "floor" or "attach". Reads "run K" lines, answers the mean seconds a step (JSON)."""
    sys.path.insert(0, os.path.abspath(path))
    import torch

    import hookstats
    from hookstats.tools.bench.models import make_workload
    assert os.path.abspath(hookstats.__file__).startswith(os.path.abspath(path)), hookstats.__file__
    torch.set_num_threads(1)
    model, step = make_workload(workload)
    mon = None
    if kind == "attach":
        mon = hookstats.attach(model, **json.loads(attach_kwargs))
    elif kind == "floor":
        from hook_overhead import install_floor
        install_floor(model)
    for _ in range(WARMUP):
        step()
    print(json.dumps({"ready": hookstats.__file__, "backend": hookstats.backend()}), flush=True)
    for line in sys.stdin:
        n = int(line.split()[1])
        t0 = time.thread_time()
        for _ in range(n):
            step()
        print(json.dumps((time.thread_time() - t0) / n), flush=True)
    if mon is not None:
        mon.remove()


class Worker(worker_pipe.Worker):
    def __init__(self, path, workload, kind, attach_kwargs, malloc):
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=HERE, **(STABLE_MALLOC if malloc else {}))
        super().__init__([sys.executable, os.path.abspath(__file__), "--worker", path, workload, kind, attach_kwargs],
                         env)



def variants(old, new):
    """label: (checkout, kind, attach kwargs as JSON)."""
    o, n = git_commit(old), git_commit(new)
    history = json.dumps({"history": True})
    return {"no hooks": (new, "none", "{}"),
            "floor: own hooks, o.sum() + g.sum()": (new, "floor", "{}"),
            f"{o} attach(model)": (old, "attach", "{}"),
            f"{n} attach(model)": (new, "attach", "{}"),
            f"{o} attach(model, history=True)": (old, "attach", history),
            f"{n} attach(model, history=True)": (new, "attach", history)}, o, n


def spread(xs):
    q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else (xs[0],) * 3
    return {"ratio": statistics.median(xs), "ratio_q1": q1, "ratio_q3": q3, "ratio_min": min(xs),
            "ratio_max": max(xs), "rounds": len(xs)}


def summarize(workload, times, o, n):
    """Rows: each variant's ms a step and ratio to no hooks; then new/old for the defaults and for history."""
    base = times["no hooks"]
    rows = {}
    for label, ts in times.items():
        rows[f"{workload}: {label}"] = {"step_ms": 1e3 * statistics.median(ts),
                                        **spread([t / b for t, b in zip(ts, base)])}
    for what in ("attach(model)", "attach(model, history=True)"):
        new, old = times[f"{n} {what}"], times[f"{o} {what}"]
        rows[f"{workload}: {what}, {n} / {o}"] = {"step_ms": 1e3 * (statistics.median(new) - statistics.median(old)),
                                                   **spread([a / b for a, b in zip(new, old)])}
    return rows


def main():
    if sys.argv[1:2] == ["--worker"]:
        return worker(*sys.argv[2:6])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="directory holding the old hookstats package (with its _C.so)")
    ap.add_argument("--new", default=".", help="directory holding the new hookstats package")
    ap.add_argument("--workloads", default="cnn,transformer")
    ap.add_argument("--rounds", type=int, default=8, help="fresh sets of workers, one timed window each")
    ap.add_argument("--steps", type=int, default=LOG_EVERY, help="timed steps per worker per round")
    ap.add_argument("--glibc-defaults", action="store_true", help="leave glibc's malloc settings as they are")
    ap.add_argument("--json", default=os.path.join(results_file.ROOT, "benchmarks", "results",
                                                   "version_step_cost.json"))
    a = ap.parse_args()
    if a.steps % LOG_EVERY:
        ap.error(f"--steps must be a multiple of log_every ({LOG_EVERY}): the same flushes in every window")
    import torch
    torch.set_num_threads(1)  # the workers' setting, which the machine line reports
    vs, o, n = variants(a.old, a.new)
    labels = list(vs)
    load = os.getloadavg()[0]
    results = {}
    for w in a.workloads.split(","):
        times = {v: [] for v in labels}
        for r in range(a.rounds):
            order = labels[r % len(labels):] + labels[:r % len(labels)]
            order = order[::-1] if r % 2 else order
            workers = {v: Worker(*vs[v][:1], w, *vs[v][1:], not a.glibc_defaults) for v in order}
            for v in order:
                times[v].append(workers[v].ask(f"run {a.steps}"))
            for wk in workers.values():
                wk.close()
            results.update(summarize(w, times, o, n))
            line = results_file.machine(load_start=load) + (f", {a.steps} steps a round, fresh worker processes"
                                                           f" each round, {o} (old) against {n} (new)")
            results_file.write(a.json, results, line)
            print(f"{w} round {r + 1}/{a.rounds}: " + ", ".join(
                f"{k.split(': ', 1)[1]} {v['ratio']:.3f}" for k, v in results.items()
                if k.startswith(w) and " / " in k), flush=True)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
