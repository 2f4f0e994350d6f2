"""The cost of the model-changed-after-attach check (hookstats/structure.py) on Paddle models: CPU time
(time.thread_time, one thread) of one check of an unchanged model (its fingerprint: the ids of every layer, and
with param_grads of every parameter and whether it stops gradients) and of the comparison a changed fingerprint
adds, on a Paddle TransformerEncoder (6 layers) and an MLP of N Linear layers, with attach's defaults and with
param_grads=True. Medians of repeated checks, with min and max. The torch figures: benchmarks/structure_check.py.

  PYTHONPATH=. python benchmarks/paddle_structure_check.py [--repeats 200]
      [--out benchmarks/results/paddle_structure_check.json]
"""
import argparse

import paddle
import torch

import hookstats
from structure_check import row, save, timed_checks


def encoder():
    return paddle.nn.TransformerEncoder(paddle.nn.TransformerEncoderLayer(256, 4, 1024), 6)


def mlp(n):
    return paddle.nn.Sequential(*[paddle.nn.Linear(8, 8) for _ in range(n)])


def attached(model, **kwargs):
    if kwargs.get("param_grads"):
        kwargs["optimizer"] = paddle.optimizer.SGD(0.1, parameters=model.parameters())
    return hookstats.attach(model, **kwargs)


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
            rows.append(row(name, "layer", layers, label, *timed_checks(attached(model, **kw), args.repeats)))
            print(rows[-1])
    if args.out:
        save(args.out, "paddle_structure_check.py", {"paddle": paddle.__version__}, rows)


if __name__ == "__main__":
    main()
