"""Wall time of `python -m hookstats report` against the number of targets. Each history is a real run: a model of
N/2 tiny Linear(4, 4) modules (N targets: each output and the gradient into it) trained STEPS steps with a
JSONLSink, log_every=10 (float buckets once per flush). Each report runs in a fresh process, as a user runs it, so
the time includes reading the file, the charts, the table and the imports. --profile PATH writes cProfile's
statistics of the largest report instead of timing all of them."""
import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import results_file
import torch
from torch import nn

import hookstats
from hookstats.sinks import JSONLSink

ROOT = Path(__file__).resolve().parent.parent


def write_run(folder, targets, steps):
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(targets // 2)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with hookstats.attach(model, sinks=[JSONLSink(folder / "history.jsonl")], log_every=10, alerts=False):
        for _ in range(steps):
            model(torch.randn(2, 4)).square().mean().backward()
            opt.step()
            opt.zero_grad()
    return folder


def time_report(folder, profile=None):
    cmd = [sys.executable, *(["-m", "cProfile", "-o", profile] if profile else []), "-m", "hookstats", "report",
           str(folder), "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    spent = time.perf_counter() - t
    if r.returncode:
        raise SystemExit(f"report failed: {r.stderr[-2000:]}")
    return spent, len(list((folder / "charts").glob("*.png")))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--targets", type=int, nargs="+", default=[20, 2000, 20000])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--profile", help="cProfile output of the report of the largest --targets (no timing)")
    ap.add_argument("--json", help="write the results file here (e.g. benchmarks/results/report_scale.json)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    load = os.getloadavg()[0]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in sorted(args.targets):
            folder = write_run(Path(tmp) / f"run{n}", n, args.steps)
            mb = (folder / "history.jsonl").stat().st_size / 1e6
            if args.profile and n != max(args.targets):
                continue
            spent, charts = time_report(folder, args.profile if args.profile else None)
            print(f"{n:6d} targets, {args.steps} steps, {mb:7.1f} MB history: report {spent:6.1f} s, {charts} charts",
                  flush=True)
            results[f"{n} targets"] = {"steps": args.steps, "history_mb": round(mb, 1), "report_s": round(spent, 2),
                                       "charts": charts}
    if args.json and not args.profile:
        results_file.write(args.json, results, results_file.machine(clock="wall clock", load_start=load) +
                           ", the report in a fresh process each")


if __name__ == "__main__":
    main()
