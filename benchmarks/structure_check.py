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


def check_times(model, repeats, **kwargs):
    mon = hookstats.attach(model, **kwargs)
    structure = mon.structure
    assert structure.changes() == []
    times, full = [], []
    for _ in range(repeats):
        t = time.thread_time()
        structure.check()  # an unchanged model: the fingerprint alone
        times.append(time.thread_time() - t)
        t = time.thread_time()
        structure.changes()  # what a changed fingerprint adds (a wrapper inserted, or a real change)
        full.append(time.thread_time() - t)
    mon.remove()
    return times, full


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
            ts, full = check_times(model, args.repeats, **kw)
            med = statistics.median(ts)
            rows.append({"model": name, "modules": modules, "attach": label, "median_us": round(med * 1e6, 1),
                         "min_us": round(min(ts) * 1e6, 1), "max_us": round(max(ts) * 1e6, 1),
                         "us_per_module": round(med * 1e6 / modules, 2),
                         "changed_fingerprint_median_us": round(statistics.median(full) * 1e6, 1)})
            print(rows[-1])
    if args.out:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        with open(args.out, "w") as f:
            json.dump({"command": "PYTHONPATH=. python benchmarks/structure_check.py --out " + args.out,
                       "commit": commit, "machine": "2-core shared CPU", "torch": torch.__version__,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
