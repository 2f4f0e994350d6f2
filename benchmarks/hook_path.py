"""The hook path before and after a change: per-step CPU time (time.thread_time, 1 torch thread) of the
benchmark CNN and transformer (and GPT-2 from a small config, and stackN) with attach(model) defaults, for two
checkouts of hookstats (each in its own worker process: both register the same torch ops), the floor (the user's
own hooks on the same modules, o.sum() on each output and g.sum() on its gradient: each value read once) and a
worker without hooks, interleaved in one run with the order rotated each round, over several fresh sets of
workers; plus the Python calls (sys.setprofile) and the torch ops (a dispatch mode) of one hooked step, which noise
cannot move.

  git archive <base> hookstats csrc | tar -x -C /tmp/base && cp hookstats/_C*.so /tmp/base/hookstats/
  PYTHONPATH=. python benchmarks/hook_path.py --old /tmp/base --new . [--processes 6 --rounds 4 --steps 5]
      [--workloads cnn transformer gpt2 stack32] [--attach '{"param_grads": true}']   (attach's keywords, JSON)
"""
import argparse
import json
import os
import statistics
import sys
import time

import worker_pipe


def gpt2_workload():
    """(model, step): GPT-2 from a small config (2 layers, width 128; no download), batch 8 of 128 tokens, AdamW.
    Its blocks return tuples: the hooks' leaves step runs on them."""
    import torch
    from hook_overhead import make_gpt2
    return make_gpt2(2, seq=128, batch=8, optimizer=torch.optim.AdamW, n_embd=128, n_head=4, vocab_size=1000,
                     n_positions=128)


def worker(path, workload, mode, attach_kwargs):
    """mode: "hookstats", "floor" or "none". Reads commands from stdin ("run K", "calls", "ops"), answers one JSON
    line each."""
    sys.path.insert(0, os.path.abspath(path))
    import torch

    import hookstats
    from hookstats.tools.bench.models import make_workload
    assert os.path.abspath(hookstats.__file__).startswith(os.path.abspath(path)), hookstats.__file__
    torch.set_num_threads(1)
    model, step = gpt2_workload() if workload == "gpt2" else make_workload(workload)
    mon = hookstats.attach(model, **json.loads(attach_kwargs)) if mode == "hookstats" else None
    if mode == "floor":
        from hook_overhead import install_floor
        install_floor(model)
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
    def __init__(self, path, workload, mode, attach_kwargs="{}"):
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH="")
        super().__init__([sys.executable, __file__, "--worker", path, workload, mode, attach_kwargs], env)


def spread(xs):
    return {"median": round(statistics.median(xs), 4), "min": round(min(xs), 4), "max": round(max(xs), 4)}


def compare(workload, old, new, rounds, steps, processes, attach_kwargs="{}"):
    """`processes` fresh sets of workers (a process's own layout biases its times by several %, so ratios are
    taken over several), each running `rounds` interleaved rounds of `steps` steps per worker. Ratios are per
    round; "added time" is a variant's time beyond no hooks over another's."""
    names = ["old", "new", "floor", "no hooks"]
    modes = {"old": "hookstats", "new": "hookstats", "floor": "floor", "no hooks": "none"}
    pairs = {"new_over_old": ("new", "old"), "new_over_floor": ("new", "floor"), "old_over_floor": ("old", "floor")}
    ratio, added, per_set, ms = {k: [] for k in pairs}, {k: [] for k in pairs}, [], {n: [] for n in names}
    for p in range(processes):
        spawn = names[p % len(names):] + names[:p % len(names)]
        workers = {n: Worker(old if n == "old" else new, workload, modes[n], attach_kwargs) for n in spawn}
        calls = {n: {**workers[n].ask("calls"), "torch_ops": workers[n].ask("ops")} for n in names}
        per_round = {n: [] for n in names}
        for r in range(rounds):
            k = (p + r) % len(names)
            for n in names[k:] + names[:k]:
                per_round[n].append(statistics.median(workers[n].ask(f"run {steps}")))
        for w in workers.values():
            w.close()
        for key, (a, b) in pairs.items():
            ratio[key] += [x / y for x, y in zip(per_round[a], per_round[b])]
            added[key] += [(x - z) / (y - z) for x, y, z in zip(per_round[a], per_round[b], per_round["no hooks"])]
        per_set.append(statistics.median(x / y for x, y in zip(per_round["new"], per_round["old"])))
        for n in names:
            ms[n] += per_round[n]
    return {"ms_per_step": {n: round(1e3 * statistics.median(v), 2) for n, v in ms.items()},
            **{k: spread(v) for k, v in ratio.items()},
            "new_over_old_per_process_set": [round(x, 4) for x in per_set],
            **{f"added_time_{k}": spread(v) for k, v in added.items()},
            "python_calls_per_step": calls, "backend": workers["new"].info["backend"]}


def rows(out):
    """The run's figures as results rows: per workload each variant's ms a step and calls a step, then each ratio
    (median of the per-round ratios, their min and max) with the added time's ratio beside it."""
    res = {}
    for w, r in out.items():
        if not isinstance(r, dict) or "ms_per_step" not in r:
            continue
        for n, ms in r["ms_per_step"].items():
            calls = r["python_calls_per_step"][n]
            res[f"{w}: {n}"] = {"ms": ms, "calls": calls["call"], "c_calls": calls["c_call"],
                                "torch_ops": calls["torch_ops"]}
        for key in ("new_over_old", "new_over_floor", "old_over_floor"):
            ratio, added = r[key], r[f"added_time_{key}"]
            res[f"{w}: {key.replace('_over_', ' / ')}"] = {
                "ratio": ratio["median"], "ratio_min": ratio["min"], "ratio_max": ratio["max"],
                "added": added["median"], "added_min": added["min"], "added_max": added["max"]}
    return res


def main():
    if sys.argv[1:2] == ["--worker"]:
        return worker(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] if len(sys.argv) > 5 else "{}")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="directory holding the old hookstats package (with _C.so)")
    ap.add_argument("--new", default=".", help="directory holding the new hookstats package")
    ap.add_argument("--workloads", nargs="+", default=["cnn", "transformer"], help="cnn, transformer, gpt2, stackN")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10, help="steps per worker per round (their median is taken)")
    ap.add_argument("--processes", type=int, default=1, help="fresh sets of worker processes, one after another")
    ap.add_argument("--attach", default="{}", help="attach()'s keyword arguments as JSON (default: none)")
    ap.add_argument("--json", help="also write the figures there in benchmarks/results' shape (results_file.py)")
    a = ap.parse_args()
    load = os.getloadavg()[0]
    out = {"old": worker_pipe.git_commit(a.old), "new": worker_pipe.git_commit(a.new), "load_before": os.getloadavg(),
           "attach": json.loads(a.attach)}
    for w in a.workloads:
        out[w] = compare(w, a.old, a.new, a.rounds, a.steps, a.processes, a.attach)
        print(w, json.dumps(out[w]), flush=True)
    out["load_after"] = os.getloadavg()
    print(json.dumps(out))
    if a.json:
        write(a.json, out, load)


def write(path, out, load, argv=None):
    import results_file
    import torch
    torch.set_num_threads(1)  # what the workers ran with: the machine line names it
    results_file.write(path, rows(out), results_file.machine(load_start=load) +
                       f"; old: {out['old']}, new: {out['new']}", argv)


if __name__ == "__main__":
    main()
