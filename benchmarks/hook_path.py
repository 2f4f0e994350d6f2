"""The hook path before and after a change: per-step CPU time (time.thread_time, 1 torch thread) of the
benchmark CNN and transformer with attach(model) defaults, for two checkouts of hookstats (each in its own
worker process: both register the same torch ops) and a worker without hooks, interleaved in one run with the
order rotated each round, over several fresh sets of workers; plus the Python calls (sys.setprofile) and the
torch ops (a dispatch mode) of one hooked step, which noise cannot move.

  git archive <base> hookstats | tar -x -C /tmp/base && cp hookstats/_C*.so /tmp/base/hookstats/
  PYTHONPATH=. python benchmarks/hook_path.py --old /tmp/base --new . [--processes 6 --rounds 4 --steps 5]
      [--attach '{"param_grads": true}']   (attach's keyword arguments, JSON; default: its defaults)
"""
import argparse
import json
import os
import statistics
import sys
import time

import worker_pipe


def worker(path, workload, hooked, attach_kwargs):
    """Reads commands from stdin ("run K", "calls"), answers one JSON line each."""
    sys.path.insert(0, os.path.abspath(path))
    import torch

    import hookstats
    from hookstats.tools.bench.models import make_workload
    assert os.path.abspath(hookstats.__file__).startswith(os.path.abspath(path)), hookstats.__file__
    torch.set_num_threads(1)
    model, step = make_workload(workload)
    mon = hookstats.attach(model, **json.loads(attach_kwargs)) if hooked else None
    for _ in range(3):
        step()
    print(json.dumps({"ready": hookstats.__file__, "backend": hookstats.backend()}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "run":
            times = []
            for _ in range(int(cmd[1])):
                t0 = time.thread_time()
                step()
                times.append(time.thread_time() - t0)
            print(json.dumps(times), flush=True)
        elif cmd[0] == "calls":
            counts = {"call": 0, "c_call": 0}

            def count(frame, event, arg):
                if event in counts:
                    counts[event] += 1
            sys.setprofile(count)
            step()
            sys.setprofile(None)
            print(json.dumps(counts), flush=True)
        elif cmd[0] == "ops":
            from torch.utils._python_dispatch import TorchDispatchMode

            class Count(TorchDispatchMode):
                n = 0

                def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                    Count.n += 1
                    return func(*args, **(kwargs or {}))
            with Count():
                step()
            print(json.dumps(Count.n), flush=True)
    if mon is not None:
        mon.remove()


class Worker(worker_pipe.Worker):
    def __init__(self, path, workload, hooked, attach_kwargs="{}"):
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH="")
        super().__init__([sys.executable, __file__, "--worker", path, workload, str(int(hooked)), attach_kwargs], env)


def spread(xs):
    return {"median": round(statistics.median(xs), 4), "min": round(min(xs), 4), "max": round(max(xs), 4)}


def compare(workload, old, new, rounds, steps, processes, attach_kwargs="{}"):
    """`processes` fresh sets of workers (a process's own layout biases its times by several %, so ratios are
    taken over several), each running `rounds` interleaved rounds of `steps` steps per worker."""
    names = ["old", "new", "no hooks"]
    ratio, hook, per_set, ms = [], [], [], {n: [] for n in names}
    for p in range(processes):
        spawn = names[p % 3:] + names[:p % 3]
        workers = {n: Worker(old if n == "old" else new, workload, n != "no hooks", attach_kwargs) for n in spawn}
        calls = {n: {**workers[n].ask("calls"), "torch_ops": workers[n].ask("ops")} for n in ("old", "new")}
        per_round = {n: [] for n in names}
        for r in range(rounds):
            k = (p + r) % len(names)
            for n in names[k:] + names[:k]:
                per_round[n].append(statistics.median(workers[n].ask(f"run {steps}")))
        for w in workers.values():
            w.close()
        mine = [a / b for a, b in zip(per_round["new"], per_round["old"])]
        ratio += mine
        per_set.append(statistics.median(mine))
        hook += [(a - c) / (b - c) for a, b, c in zip(per_round["new"], per_round["old"], per_round["no hooks"])]
        for n in names:
            ms[n] += per_round[n]
    return {"ms_per_step": {n: round(1e3 * statistics.median(v), 2) for n, v in ms.items()},
            "new_over_old": spread(ratio), "new_over_old_per_process_set": [round(x, 4) for x in per_set],
            "added_time_new_over_old": spread(hook), "python_calls_per_step": calls,
            "backend": workers["new"].info["backend"]}


def main():
    if sys.argv[1:2] == ["--worker"]:
        return worker(sys.argv[2], sys.argv[3], sys.argv[4] == "1", sys.argv[5] if len(sys.argv) > 5 else "{}")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="directory holding the old hookstats package (with _C.so)")
    ap.add_argument("--new", default=".", help="directory holding the new hookstats package")
    ap.add_argument("--workloads", nargs="+", default=["cnn", "transformer"])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10, help="steps per worker per round (their median is taken)")
    ap.add_argument("--processes", type=int, default=1, help="fresh sets of worker processes, one after another")
    ap.add_argument("--attach", default="{}", help="attach()'s keyword arguments as JSON (default: none)")
    a = ap.parse_args()
    out = {"load_before": os.getloadavg(), "attach": json.loads(a.attach)}
    for w in a.workloads:
        out[w] = compare(w, a.old, a.new, a.rounds, a.steps, a.processes, a.attach)
        print(w, json.dumps(out[w]), flush=True)
    out["load_after"] = os.getloadavg()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
