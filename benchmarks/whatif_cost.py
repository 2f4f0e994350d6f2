"""Host cost of the low-precision what-if (hookstats/whatif.py) beside the quantiles it sits with: N Linear(64, 64)
targets (outputs only, batch 32), one torch thread, thread CPU time, median of interleaved runs.

stats(): the whole mon.stats(), and the derivations of the same rows alone: the float buckets' preparation
(_occupied), the quantiles and the what-if, each given as its time beyond the preparation.
delivery: the mon.step() that flushes a history window (log_every steps), whole.
--file-growth: instead, the what-if's share of the CSV and JSONL files of a 20-layer MLP's default targets.

    PYTHONPATH=$PWD python benchmarks/whatif_cost.py --targets 200 2000 --runs 9
"""
import argparse
import csv
import json
import tempfile
from pathlib import Path
import statistics as stat
import time

import numpy as np
import torch
from torch import nn

import hookstats
from hookstats import statistics, whatif


def _timed(fn):
    t = time.thread_time()
    fn()
    return time.thread_time() - t


def _model(targets):
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(64, 64) for _ in range(targets)])


def stats_costs(targets, runs):
    model = _model(targets)
    with hookstats.attach(model, grads=False, history=False) as mon, torch.no_grad():
        model(torch.randn(32, 64))
        states = [st for _, _, st in mon.states("train")]
        f = np.stack([st.fstate.double().numpy() for st in states])
        i = np.stack([st.istate.numpy() for st in states])
        cfg = mon.cfg
        parts = {"stats()": mon.stats,
                 "prepare": lambda: statistics.derive(["_occupied"], f, i, cfg),
                 "quantiles": lambda: statistics.derive(["_occupied", "_quantiles"], f, i, cfg),
                 "what-if": lambda: statistics.derive(["_occupied", "_whatif"], f, i, cfg)}
        times = {k: [] for k in parts}
        for _ in range(runs + 1):  # the first round warms up
            for k, fn in parts.items():
                times[k].append(_timed(fn))
    med = {k: stat.median(v[1:]) * 1e3 for k, v in times.items()}
    return {"stats()": med["stats()"], "quantiles": med["quantiles"] - med["prepare"],
            "what-if": med["what-if"] - med["prepare"]}


def delivery_cost(targets, runs, log_every=10):
    model = _model(targets)
    flushes = []
    with hookstats.attach(model, grads=False, history=True, log_every=log_every, steps="manual",
                          alerts=False) as mon, torch.no_grad():
        for s in range(log_every * (runs + 1)):
            model(torch.randn(32, 64))
            spent = _timed(mon.step)
            if s >= log_every and (s + 1) % log_every == 0:  # the first window warms up
                flushes.append(spent)
    return stat.median(flushes) * 1e3


def file_growth(log_every, steps=20):
    """(CSV, JSONL) share of the bytes that the what-if fields take."""
    from hookstats.sinks import CSVSink
    from hookstats.sinks.jsonl import JSONLSink
    fields = set(whatif.field_names())
    folder = Path(tempfile.mkdtemp())
    model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(20)])
    sinks = [CSVSink(folder / "h.csv"), JSONLSink(folder / "h.jsonl")]
    with hookstats.attach(model, history=True, log_every=log_every, sinks=sinks, alerts=False):
        for _ in range(steps):
            model(torch.randn(8, 16)).square().mean().backward()
    with open(folder / "h.csv") as f:
        rows = list(csv.reader(f))
    csv_share = sum(len(",".join(r)) + 2 for r in rows if r[6] in fields) / (folder / "h.csv").stat().st_size
    with open(folder / "h.jsonl") as f:
        taken = sum(len(f'"{k}": {json.dumps(v)}, ') for line in f for k, v in json.loads(line).items() if k in fields)
    return csv_share, taken / (folder / "h.jsonl").stat().st_size


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", type=int, nargs="+", default=[200, 2000])
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--file-growth", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.file_growth:
        for log_every in (10, 1):
            c, j = file_growth(log_every)
            print(f"log_every={log_every}: what-if share of the CSV {c:.0%}, of the JSONL {j:.0%}")
        return
    print(f"thread CPU time, ms, median of {args.runs} runs")
    print("targets  stats()  quantiles  what-if  delivery (flush step)")
    for n in args.targets:
        c = stats_costs(n, args.runs)
        d = delivery_cost(n, args.runs)
        print(f"{n:7d}  {c['stats()']:7.1f}  {c['quantiles']:9.1f}  {c['what-if']:7.1f}  {d:9.1f}")


if __name__ == "__main__":
    main()
