"""The cost of the check that the model did not change after attach (hookstats/structure.py): CPU time
(time.thread_time, 1 torch thread) of one check of an unchanged model (its fingerprint: the ids of every module,
and of every parameter with param_grads/params) and of the comparison a changed fingerprint adds, which runs at the first step's end, every log_every steps and at
stats(), on GPT-2 built from its default config (12 layers, no download) and on an MLP of N Linear layers, with
attach's defaults and with param_grads=True and params=True. Medians of repeated checks, with min and max.

  PYTHONPATH=. python benchmarks/structure_check.py [--repeats 200] [--out benchmarks/results/structure_check.json]
"""
import argparse
import json
import statistics
import subprocess
import time

import torch
from torch import nn

import hookstats


def gpt2():
    import transformers
    return transformers.GPT2LMHeadModel(transformers.GPT2Config())


def mlp(n):
    return nn.Sequential(*[nn.Linear(8, 8) for _ in range(n)])


def timed_checks(mon, repeats):
    """CPU seconds of `repeats` checks of mon's unchanged model: the fingerprint alone, and the comparison a changed
    fingerprint adds (a wrapper inserted, or a real change). Removes the monitor."""
    structure = mon.structure
    assert structure.changes() == []
    times, full = [], []
    for _ in range(repeats):
        t = time.thread_time()
        structure.check()  # an unchanged model: the fingerprint alone
        times.append(time.thread_time() - t)
        t = time.thread_time()
        structure.changes()
        full.append(time.thread_time() - t)
    mon.remove()
    return times, full


def row(model, unit, count, attach, times, full):
    """One results row: the check's median, min and max in microseconds, per `unit` (module, layer) of the model."""
    med = statistics.median(times)
    return {"model": model, f"{unit}s": count, "attach": attach, "median_us": round(med * 1e6, 1),
            "min_us": round(min(times) * 1e6, 1), "max_us": round(max(times) * 1e6, 1),
            f"us_per_{unit}": round(med * 1e6 / count, 2),
            "changed_fingerprint_median_us": round(statistics.median(full) * 1e6, 1)}


def save(path, script, versions, rows):
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    with open(path, "w") as f:
        json.dump({"command": f"PYTHONPATH=. python benchmarks/{script} --out " + path, "commit": commit,
                   "machine": "2-core shared CPU", **versions, "rows": rows}, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for name, make in (("gpt2 (12 layers)", gpt2), ("mlp64", lambda: mlp(64)), ("mlp512", lambda: mlp(512))):
        model = make()
        modules = sum(1 for _ in model.modules())
        for label, kw in (("defaults", {}), ("param_grads+params", {"param_grads": True, "params": True})):
            rows.append(row(name, "module", modules, label, *timed_checks(hookstats.attach(model, **kw),
                                                                         args.repeats)))
            print(rows[-1])
    if args.out:
        save(args.out, "structure_check.py", {"torch": torch.__version__}, rows)


if __name__ == "__main__":
    main()
