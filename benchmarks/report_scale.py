"""CPU time (user + sys of the report process, which a loaded machine inflates less than wall time) and wall time
of `python -m hookstats report` against the number of targets, and of one report of many small run folders. Each history is a real run: a model of
N/2 tiny Linear(4, 4) modules (N targets: each output and the gradient into it) trained STEPS steps with a
JSONLSink, log_every=10 (float buckets once per flush). Each report runs in a fresh process, as a user runs it, so
the time includes reading the file, the charts, the table and the imports. --profile PATH writes cProfile's
statistics of the largest report instead of timing all of them. --folders N: a folder of N copies of a run of
--small-targets targets, reported by one command (a folder of runs, as the demo writes)."""
import argparse
import os
import resource
import shutil
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


def _children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def time_report(folder, profile=None):
    """(CPU seconds, wall seconds, charts written) of one report of `folder` in a fresh process."""
    cmd = [sys.executable, *(["-m", "cProfile", "-o", profile] if profile else []), "-m", "hookstats", "report",
           str(folder), "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    cpu, t = _children_cpu(), time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall, cpu = time.perf_counter() - t, _children_cpu() - cpu
    if r.returncode:
        raise SystemExit(f"report failed: {r.stderr[-2000:]}")
    return cpu, wall, len(list(folder.glob("**/charts/*.png")))


def many_folders(root, n, targets, steps):
    """root holding n run folders, copies of one run of `targets` targets."""
    one = write_run(root / "run0000", targets, steps)
    for k in range(1, n):
        shutil.copytree(one, root / f"run{k:04d}")
    return root


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--targets", type=int, nargs="+", default=[20, 2000, 20000])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--profile", help="cProfile output of the report of the largest --targets (no timing)")
    ap.add_argument("--folders", type=int, default=0, help="also time one report of this many small run folders")
    ap.add_argument("--small-targets", type=int, default=20, help="targets of each of the --folders runs")
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
            cpu, wall, charts = time_report(folder, args.profile if args.profile else None)
            print(f"{n:6d} targets, {args.steps} steps, {mb:7.1f} MB history: report {cpu:6.1f} s CPU "
                  f"({wall:6.1f} s wall), {charts} charts", flush=True)
            results[f"{n} targets"] = {"steps": args.steps, "history_mb": round(mb, 1), "report_cpu_s": round(cpu, 2),
                                       "report_wall_s": round(wall, 2), "charts": charts}
        if args.folders and not args.profile:
            root = many_folders(Path(tmp) / "folders", args.folders, args.small_targets, args.steps)
            cpu, wall, charts = time_report(root)
            print(f"{args.folders} run folders of {args.small_targets} targets: report {cpu:6.1f} s CPU "
                  f"({wall:6.1f} s wall), {charts} charts", flush=True)
            results[f"{args.folders} folders"] = {"targets": args.small_targets, "steps": args.steps,
                                                  "report_cpu_s": round(cpu, 2), "report_wall_s": round(wall, 2),
                                                  "charts": charts}
    if args.json and not args.profile:
        results_file.write(args.json, results, results_file.machine(clock="CPU time (user + sys) of the report "
                                                                          "process, and wall clock", load_start=load) +
                           ", the report in a fresh process each")


if __name__ == "__main__":
    main()
