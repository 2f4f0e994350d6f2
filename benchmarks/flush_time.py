"""Host time of the history's step end and flush: N Linear(16, 16) targets, steps="manual",
history=True, log_every=L; each mon.step() is timed on the thread's CPU clock, one torch thread. A step that
ends a window also flushes (device ring -> host, statistics of every step and target derived, MemorySink).
Prints the median step end without a flush and the median flush step, with the float buckets on and off."""
import argparse
import os
import statistics
import time

import results_file
import torch
from torch import nn

import hookstats


def run(targets, log_every, windows, float_hist):
    model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(targets)])
    mon = hookstats.attach(model, grads=False, history=True, log_every=log_every, steps="manual",
                           float_hist=float_hist, alerts=False)
    plain, flush = [], []
    with torch.no_grad():
        for s in range(log_every * (windows + 1)):
            model(torch.randn(32, 16))
            t = time.thread_time()
            mon.step()
            spent = time.thread_time() - t
            if s >= log_every:  # the first window warms up
                (flush if (s + 1) % log_every == 0 else plain).append(spent)
    mon.remove()
    return statistics.median(plain) * 1e3, statistics.median(flush) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--targets", type=int, nargs="+", default=[100, 200, 400])
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--windows", type=int, default=5)
    ap.add_argument("--json", help="write the results file here (e.g. benchmarks/results/flush_time.json)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    load = os.getloadavg()[0]
    results = {}
    print(f"log_every={args.log_every}, {args.windows} windows, 1 thread, thread CPU time, ms (median)")
    print("targets  float_hist  step end  flush step")
    for n in args.targets:
        for fh in (True, False):
            step_end, flush = run(n, args.log_every, args.windows, fh)
            print(f"{n:7d}  {str(fh):>10}  {step_end:8.2f}  {flush:10.1f}")
            results[f"{n} targets, float buckets {'on' if fh else 'off'}"] = {"step_end_ms": step_end, "flush_ms": flush}
    if args.json:
        results_file.write(args.json, results, results_file.machine(load_start=load) +
                           f", log_every={args.log_every}, {args.windows} windows")


if __name__ == "__main__":
    main()
