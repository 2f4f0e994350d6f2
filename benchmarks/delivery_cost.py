"""Host time of the history per logging window, one checkout of hookstats against another: N Linear(16, 16)
targets, steps="manual", history=True, hist_every=10, log_every 10 (one histogram step a window) or 20 (two),
float buckets on (the default), alerts on, the MemorySink alone. Every mon.step() is timed on the thread's CPU clock,
one torch thread: a window's total (each step end's record, the histogram steps' bucket rows, the flush: copy,
derivation, sinks) and its flush step alone. Two versions of the package cannot share a process (both register the
same torch ops): each variant runs in its own worker process, warmed up past the ramp (3 windows), the order of the
variants rotated each round and reversed every other round; per variant the median over rounds of each round's
median window, and per pair the median (IQR, min..max) of the per-round ratios new / old.

  git archive <old commit> | tar -x -C /tmp/base && cp hookstats/_C*.so /tmp/base/hookstats/   (same csrc/)
  PYTHONPATH=. python benchmarks/delivery_cost.py --old /tmp/base --new . [--targets 100 400 --rounds 8]
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

HIST_EVERY = 10
WARMUP_WINDOWS = 3


def worker(path, targets, log_every):
    """Reads "run K" lines, answers K windows' [total ms, flush step ms] (JSON)."""
    sys.path.insert(0, os.path.abspath(path))
    import torch
    from torch import nn

    import hookstats
    assert os.path.abspath(hookstats.__file__).startswith(os.path.abspath(path)), hookstats.__file__
    torch.set_num_threads(1)
    targets, log_every = int(targets), int(log_every)
    model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(targets)])
    mon = hookstats.attach(model, grads=False, history=True, log_every=log_every, hist_every=HIST_EVERY,
                           steps="manual")
    x = torch.randn(32, 16)

    def window():
        total = flush = 0.0
        for s in range(log_every):
            model(x)
            t = time.thread_time()
            mon.step()
            spent = time.thread_time() - t
            total += spent
            if s == log_every - 1:
                flush = spent
        return [total * 1e3, flush * 1e3]

    with torch.no_grad():
        for _ in range(WARMUP_WINDOWS):
            window()
        print(json.dumps({"ready": hookstats.__file__}), flush=True)
        for line in sys.stdin:
            print(json.dumps([window() for _ in range(int(line.split()[1]))]), flush=True)
    mon.remove()


class Worker(worker_pipe.Worker):
    def __init__(self, path, targets, log_every):
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=HERE)
        super().__init__([sys.executable, os.path.abspath(__file__), "--worker", path, str(targets), str(log_every)],
                         env)



def spread(xs):
    q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else (xs[0],) * 3
    return {"ratio": statistics.median(xs), "ratio_q1": q1, "ratio_q3": q3, "ratio_min": min(xs),
            "ratio_max": max(xs), "rounds": len(xs)}


def main():
    if sys.argv[1:2] == ["--worker"]:
        return worker(*sys.argv[2:5])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="directory holding the old hookstats package (with its _C.so)")
    ap.add_argument("--old-name", help="what the old checkout is called in the results (default: its git commit)")
    ap.add_argument("--new", default=".", help="directory holding the new hookstats package")
    ap.add_argument("--targets", type=int, nargs="+", default=[100, 400])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--windows", type=int, default=5, help="timed windows per worker per round")
    ap.add_argument("--json", default=os.path.join(results_file.ROOT, "benchmarks", "results", "delivery_cost.json"))
    a = ap.parse_args()
    import torch
    torch.set_num_threads(1)  # the workers' setting, which the machine line reports
    o, n = a.old_name or git_commit(a.old), git_commit(a.new)
    load = os.getloadavg()[0]
    results = {}
    for t in a.targets:
        for log_every in (10, 20):
            case = f"{t} targets, {log_every // HIST_EVERY} histogram step(s) a window (log_every={log_every})"
            labels = [(o, a.old), (n, a.new)]
            got = {name: {"total": [], "flush": []} for name, _ in labels}
            for r in range(a.rounds):
                order = labels[::-1] if r % 2 else labels
                for name, path in order:
                    w = Worker(path, t, log_every)
                    windows = w.ask(f"run {a.windows}")
                    w.close()
                    got[name]["total"].append(statistics.median(x[0] for x in windows))
                    got[name]["flush"].append(statistics.median(x[1] for x in windows))
            for name, _ in labels:
                results[f"{case}: {name}"] = {"window_ms": statistics.median(got[name]["total"]),
                                              "flush_ms": statistics.median(got[name]["flush"])}
            for what in ("total", "flush"):
                ratios = [x / y for x, y in zip(got[n][what], got[o][what])]
                results[f"{case}: {'window' if what == 'total' else 'flush step'}, {n} / {o}"] = spread(ratios)
            print(json.dumps({k: v for k, v in results.items() if k.startswith(case)}, indent=1), flush=True)
            line = results_file.machine(load_start=load) + (f", {a.windows} windows a worker, a fresh worker per "
                                                           f"variant and round, {o} (old) against {n} (new)")
            results_file.write(a.json, results, line)


if __name__ == "__main__":
    main()
