"""The op without histograms on the benchmark CNN's own conv and batch-norm outputs (NCHW: each channel plane has
its own mean) against the same shapes of N(0, 1) data and against x.sum(): one torch thread, the thread's CPU time,
the median of `repeats` calls each, on tensors saved from one training forward. The CPU kernels shift each block
of 1024 values by the previous block's mean; a block of other channels is re-summed about its own mean
(csrc/cpu/accumulate_avx2.h OnePass::reshift).

    PYTHONPATH=. python benchmarks/layer_outputs_op.py [--repeats 15]
"""
import argparse
import statistics
import time

import torch
from op_throughput import fresh_state
from torch import nn

from hookstats import accumulate
from hookstats.tools import bench
from hookstats.config import StatsConfig

NO_HIST = StatsConfig(linear_hist=False, log_hist=False, float_hist=False)


def per_value_ns(fn, x, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.thread_time_ns()
        fn(x)
        times.append(time.thread_time_ns() - t0)
    return statistics.median(times) / x.numel()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(1)
    f, i, s = fresh_state(NO_HIST)
    on = torch.ones(1, dtype=torch.bool)

    def op(x):
        accumulate.accumulate_(x, f, i, s, on, NO_HIST.op_params())
    model, step = bench.make_workload("cnn")
    for _ in range(3):
        step()
    outs = []
    hooks = [m.register_forward_hook(lambda m, a, o: outs.append((type(m).__name__, o.detach().clone())))
             for m in model.features if isinstance(m, (nn.Conv2d, nn.BatchNorm2d))]
    step()
    for h in hooks:
        h.remove()
    print(f"{'output':12s} {'shape':18s} ns/value: op / op on randn_like / x.sum()")
    for name, x in outs:
        r = torch.randn_like(x)
        print(f"{name:12s} {str(tuple(x.shape)):18s} {per_value_ns(op, x, args.repeats):.3f} / "
              f"{per_value_ns(op, r, args.repeats):.3f} / {per_value_ns(torch.sum, x, args.repeats):.3f}")


if __name__ == "__main__":
    main()
