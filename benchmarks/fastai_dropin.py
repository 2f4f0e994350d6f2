"""Step cost of the fastai drop-in (hookstats.integrations.fastai.ActivationStats) with and without the float
buckets, beside fastai's own ActivationStats, with and without with_hist: the benchmark workloads, one torch
thread, the thread's CPU clock, the variants interleaved (order rotated each round), medians of the per-round
ratios to no hooks, and the op's own time per step inside each drop-in (its calls timed on the same clock).
Needs fastai (`pip install ".[fastai]"`)."""
import argparse
import statistics
import types

import torch

from hookstats import accumulate
from hookstats.tools.bench import timing
from hookstats.tools.bench.models import make_workload
from hookstats.tools.bench.variants import Installed, install_fastai
from hookstats.integrations.fastai import ActivationStats


def install_dropin(model, spent, **kw):
    """The drop-in as a Learner drives it (before_fit, after_batch each batch), its op calls timed into spent."""
    cb = ActivationStats(**kw)
    cb.learn = types.SimpleNamespace(model=model, training=True, train_iter=0)
    cb.before_fit()
    timed, real = timing.timed_ops(spent)

    def after_step():
        cb.after_batch()
        cb.learn.train_iter += 1

    def remove():
        cb.after_fit()
        accumulate.accumulate_, accumulate.accumulate_many_ = real
    accumulate.accumulate_, accumulate.accumulate_many_ = timed
    return Installed(after_step, remove)


def variants(with_hist):
    out = {"no hooks": lambda m, s: Installed(), "fastai": lambda m, s: install_fastai(m, with_hist=with_hist)}
    for fh in (True, False):
        out[f"drop-in, float_hist={fh}"] = lambda m, s, fh=fh: install_dropin(m, s, with_hist=with_hist, float_hist=fh)
    return out


def run(workload, with_hist, rounds, steps):
    vs = variants(with_hist)
    names = list(vs)
    model, step = make_workload(workload)
    for _ in range(2):
        step()
    ratios, times, op = ({k: [] for k in names} for _ in range(3))
    for r in range(rounds):
        t = {}
        for k in names[r % len(names):] + names[: r % len(names)]:
            spent = [0.0]
            inst = vs[k](model, spent)
            try:
                timing.time_steps(step, inst.after_step, 2)
                spent[0] = 0.0
                t[k] = timing.time_steps(step, inst.after_step, steps)
                op[k].append(spent[0] / steps)
            finally:
                inst.remove()
        for k in names:
            ratios[k].append(t[k] / t["no hooks"])
            times[k].append(t[k])
    return {k: (statistics.median(times[k]) * 1e3, statistics.median(ratios[k]), min(ratios[k]), max(ratios[k]),
                statistics.median(op[k]) * 1e3) for k in names}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workloads", nargs="+", default=["cnn", "transformer"])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(1)
    timing.set_clock("cpu")
    print(f"1 thread, thread CPU time, {args.rounds} rounds of {args.steps} steps, interleaved; medians")
    print(f"{'workload':12s} {'with_hist':9s} {'variant':26s} {'ms/step':>8s} {'ratio':>6s} {'(min..max)':>13s} "
          f"{'op ms/step':>10s}")
    for w in args.workloads:
        for with_hist in (False, True):
            for k, (ms, ratio, lo, hi, op) in run(w, with_hist, args.rounds, args.steps).items():
                print(f"{w:12s} {str(with_hist):9s} {k:26s} {ms:8.1f} {ratio:6.3f} ({lo:.3f}..{hi:.3f}) {op:10.2f}",
                      flush=True)


if __name__ == "__main__":
    main()
