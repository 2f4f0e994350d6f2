"""The cost of the model-changed-after-attach check (hookstats/structure.py) on Paddle models: CPU time
(time.thread_time, one thread) of one check of an unchanged model (its fingerprint: the ids of every layer, and
with param_grads of every parameter and whether it stops gradients) and of the comparison a changed fingerprint
adds, on a Paddle TransformerEncoder (6 layers) and an MLP of N Linear layers, with attach's defaults and with
param_grads=True. Medians of repeated checks, with min and max. The torch figures: benchmarks/structure_check.py.

  PYTHONPATH=. python benchmarks/paddle_structure_check.py [--repeats 200]
      [--out benchmarks/results/paddle_structure_check.json]
"""
import argparse
import json
import statistics
import subprocess
import time

import paddle
import torch

import hookstats


def encoder():
    return paddle.nn.TransformerEncoder(paddle.nn.TransformerEncoderLayer(256, 4, 1024), 6)


def mlp(n):
    return paddle.nn.Sequential(*[paddle.nn.Linear(8, 8) for _ in range(n)])


def check_times(model, repeats, **kwargs):
    if kwargs.get("param_grads"):
        kwargs["optimizer"] = paddle.optimizer.SGD(0.1, parameters=model.parameters())
    mon = hookstats.attach(model, **kwargs)
    structure = mon.structure
    assert structure.changes() == []
    times, full = [], []
    for _ in range(repeats):
        t = time.thread_time()
        structure.check()  # an unchanged model: the fingerprint alone
        times.append(time.thread_time() - t)
        t = time.thread_time()
        structure.changes()  # what a changed fingerprint adds
        full.append(time.thread_time() - t)
    mon.remove()
    return times, full


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.set_num_threads(1)  # the check is Python walking the model: no thread of its own
    rows = []
    for name, make in (("encoder (6 layers)", encoder), ("mlp64", lambda: mlp(64))):
        model = make()
        layers = len(model.sublayers(include_self=True))
        for label, kw in (("defaults", {}), ("param_grads", {"param_grads": True})):
            ts, full = check_times(model, args.repeats, **kw)
            med = statistics.median(ts)
            rows.append({"model": name, "layers": layers, "attach": label, "median_us": round(med * 1e6, 1),
                         "min_us": round(min(ts) * 1e6, 1), "max_us": round(max(ts) * 1e6, 1),
                         "us_per_layer": round(med * 1e6 / layers, 2),
                         "changed_fingerprint_median_us": round(statistics.median(full) * 1e6, 1)})
            print(rows[-1])
    if args.out:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        with open(args.out, "w") as f:
            json.dump({"command": "PYTHONPATH=. python benchmarks/paddle_structure_check.py --out " + args.out,
                       "commit": commit, "machine": "2-core shared CPU", "paddle": paddle.__version__,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
