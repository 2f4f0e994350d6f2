"""The floor of the op's per-value work on the CPU: what each statistic adds to one read of the values. Captures
the tensors hookstats measures in one training step of a workload (each hooked module's output and the gradient
into it), builds benchmarks/op_floor/floor.cpp against csrc/ (the op's own AVX-512 kernel and one-pass loops of
the same shape that add one statistic at a time: the moments, min/max, the near-zero count, the prefetch) and
times each over those tensors, every tensor freshly written before its call, the variants rotated each round,
one thread, the thread's CPU clock. "x_sum" is the median over rounds of the variant's time / one read's time,
with its IQR. --cap N: only the first N values of each tensor, called over and over, so that they stay in the
cache: the loops' own speed, memory no limit (the float buckets' flush at each call then dominates their row).
Needs g++ and a CPU with AVX-512.

    PYTHONPATH=. python benchmarks/op_floor.py --workload cnn --rounds 30
    (writes benchmarks/results/op_floor_<workload>.json; --json names another file)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from step_floor import commit, machine  # noqa: E402


def capture(workload):
    """Each hooked module's output and the gradient into it, from the second step of the workload."""
    from hookstats.tools.bench.models import make_workload
    from hookstats.tools.bench.variants import hooked_modules
    model, step = make_workload(workload)
    caps = []

    def hook(m, args, out):
        if isinstance(out, torch.Tensor) and out.is_floating_point():
            caps.append(out.detach().clone())
            if out.requires_grad:
                out.register_hook(lambda g: caps.append(g.detach().clone()))
    handles = [m.register_forward_hook(hook) for m in hooked_modules(model)]
    step()
    caps.clear()
    step()
    for h in handles:
        h.remove()
    return [c.float().contiguous() for c in caps]


def build(out):
    include = os.path.join(os.path.dirname(torch.__file__), "include")
    subprocess.run(["g++", "-O3", "-g0", "-ffp-contract=off", "-std=c++17", "-w", f"-I{include}",
                    f"-I{os.path.join(ROOT, 'csrc')}", os.path.join(HERE, "op_floor", "floor.cpp"), "-o", out],
                   check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="cnn")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--cap", type=int, default=0, help="values per tensor, repeated (cache-resident)")
    ap.add_argument("--json", help="default: benchmarks/results/op_floor_<workload>[_cap<N>].json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        exe, data = os.path.join(tmp, "floor"), os.path.join(tmp, "tensors.bin")
        build(exe)
        caps = capture(args.workload)
        with open(data, "wb") as f:
            np.array([len(caps)], dtype=np.int64).tofile(f)
            np.array([c.numel() for c in caps], dtype=np.int64).tofile(f)
            for c in caps:
                c.numpy().tofile(f)
        out = json.loads(subprocess.run([exe, data, str(args.rounds), str(args.cap)], check=True, capture_output=True,
                                        text=True).stdout)
    print(f"{args.workload}{f' (first {args.cap} values of each, repeated)' if args.cap else ''}: {out['tensors']} tensors, {out['values'] / 1e6:.2f}M values, {args.rounds} rounds, "
          f"load {load[0]:.1f} -> {os.getloadavg()[0]:.1f}")
    for label, r in out["results"].items():
        print(f"  {label:42s} {r['ms']:7.3f} ms  {r['ns_per_value']:.4f} ns/value  "
              f"{r['x_sum']:.2f}x [{r['x_sum_q1']:.2f}..{r['x_sum_q3']:.2f}]")
    name = f"op_floor_{args.workload}" + (f"_cap{args.cap}" if args.cap else "") + ".json"
    path = args.json or os.path.join(HERE, "results", name)
    with open(path, "w") as f:
        json.dump({"machine": machine(), "torch": torch.__version__, "commit": commit(),
                   "command": "PYTHONPATH=. python benchmarks/op_floor.py " + " ".join(sys.argv[1:]),
                   "threads": 1, "rounds": args.rounds, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                   "load": [load[0], os.getloadavg()[0]], "values": out["values"], "tensors": out["tensors"], "cap": args.cap,
                   "results": out["results"]}, f, indent=1)


if __name__ == "__main__":
    main()
