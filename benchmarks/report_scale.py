"""CPU time (user + sys of the report process, which a loaded machine inflates less than wall time) and wall time
of `python -m hookstats report` against the number of targets, and of one report of many small run folders. Each history is a real run: a model of
N/2 tiny Linear(4, 4) modules (N targets: each output and the gradient into it) trained STEPS steps with a
JSONLSink, log_every=10 (float buckets once per flush). Each report runs in a fresh process, as a user runs it, so
the time includes reading the file, the charts, the table and the imports. --profile PATH writes cProfile's
statistics of the largest report instead of timing all of them. --folders N: a folder of N copies of a run of
--small-targets targets, reported by one command (a folder of runs, as the demo writes), with --jobs N passed on.
--keep DIR keeps the histories there and reuses them (writing the 20,000-target one takes minutes). --baseline PATH:
a checkout of an earlier commit (with its hookstats/_C.so) timed on the same histories, interleaved with this one,
--repeats times each; the figures are medians with their min and max. --breakdown: instead of the whole report's
time, each part's (report_parts.py: imports, reading, deriving, table, each chart) in the same fresh processes,
medians over --repeats; the process's own CPU and wall time beside them."""
import argparse
import json
import statistics
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


def time_report(folder, profile=None, tree=ROOT, jobs=None):
    """(CPU seconds, wall seconds, charts written) of one report of `folder` in a fresh process, with the hookstats
    of the checkout `tree`."""
    cmd = [sys.executable, *(["-m", "cProfile", "-o", str(Path(profile).resolve())] if profile else []), "-m",
           "hookstats", "report", str(Path(folder).resolve()), "--no-progress",
           *([] if jobs is None else ["--jobs", str(jobs)])]
    env = {**os.environ, "PYTHONPATH": str(tree), "MPLBACKEND": "Agg"}
    cpu, t = _children_cpu(), time.perf_counter()
    # run in the tree: `python -m` puts the working folder first on sys.path, ahead of PYTHONPATH, so a report run
    # from this checkout would time this checkout's hookstats under the baseline's name
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tree)
    wall, cpu = time.perf_counter() - t, _children_cpu() - cpu
    if r.returncode:
        raise SystemExit(f"report failed: {r.stderr[-2000:]}")
    return cpu, wall, len(list(folder.glob("**/charts/*.png")))


def time_parts(folder, tree=ROOT):
    """({part: [CPU s, wall s]} of report_parts.py, the process's CPU seconds, its wall seconds) of one report of
    `folder` in a fresh process with the hookstats of the checkout `tree`."""
    out = Path(tempfile.mkdtemp(prefix="report_parts_"))
    cmd = [sys.executable, str(ROOT / "benchmarks" / "report_parts.py"), str(folder), str(out)]
    env = {**os.environ, "PYTHONPATH": str(tree), "MPLBACKEND": "Agg"}
    cpu, t = _children_cpu(), time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall, cpu = time.perf_counter() - t, _children_cpu() - cpu
    shutil.rmtree(out, ignore_errors=True)
    if r.returncode:
        raise SystemExit(f"report failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1]), cpu, wall


def broken_down(label, folder, args, trees):
    """{tree: row} of --repeats breakdowns of folder with each tree, interleaved: per part the median CPU and wall
    seconds; prints one table per tree."""
    runs = {name: [] for name in trees}
    for _ in range(args.repeats):
        for name, tree in trees.items():
            runs[name].append(time_parts(folder, tree))
    rows = {}
    for name, got in runs.items():
        parts = list(dict.fromkeys(k for g in got for k in g[0]))
        row = {"process_cpu_s": round(statistics.median(g[1] for g in got), 2),
               "process_cpu_min_s": round(min(g[1] for g in got), 2),
               "process_cpu_max_s": round(max(g[1] for g in got), 2),
               "process_wall_s": round(statistics.median(g[2] for g in got), 2), "repeats": len(got)}
        print(f"{label} [{name}]: process {row['process_cpu_s']:.1f} s CPU [{row['process_cpu_min_s']:.1f}.."
              f"{row['process_cpu_max_s']:.1f}] ({row['process_wall_s']:.1f} s wall)", flush=True)
        for part in parts:
            cpu = [g[0].get(part, [0.0, 0.0])[0] for g in got]
            wall = [g[0].get(part, [0.0, 0.0])[1] for g in got]
            key = part.replace(" ", "_")
            row[f"{key}_cpu_s"] = round(statistics.median(cpu), 2)
            row[f"{key}_wall_s"] = round(statistics.median(wall), 2)
            print(f"  {part:32s} {statistics.median(cpu):7.2f} s CPU [{min(cpu):.2f}..{max(cpu):.2f}] "
                  f"{statistics.median(wall):7.2f} s wall", flush=True)
        rows[name] = row
    return rows


def many_folders(root, n, targets, steps):
    """root holding n run folders, copies of one run of `targets` targets."""
    one = write_run(root / "run0000", targets, steps)
    for k in range(1, n):
        shutil.copytree(one, root / f"run{k:04d}")
    return root


def kept(folder, make):
    """folder, made by make(folder) unless a complete one is there (--keep); a half-written one is made again."""
    done = folder / ".complete"
    if not done.exists():
        shutil.rmtree(folder, ignore_errors=True)
        make(folder)
        done.touch()
    for charts in folder.glob("**/charts"):  # each report draws them anew
        shutil.rmtree(charts)
    return folder


def timed(label, folder, args, trees):
    """{tree: row} of --repeats reports of folder with each tree, interleaved; prints one line per tree."""
    runs = {name: [] for name in trees}
    for _ in range(args.repeats):
        for name, tree in trees.items():
            runs[name].append(time_report(folder, tree=tree, jobs=args.jobs if name == "this" else None))
            for charts in folder.glob("**/charts"):
                shutil.rmtree(charts)
    rows = {}
    for name, got in runs.items():
        cpu, wall, charts = [g[0] for g in got], [g[1] for g in got], got[0][2]
        print(f"{label} [{name}]: report {statistics.median(cpu):6.1f} s CPU [{min(cpu):.1f}..{max(cpu):.1f}] "
              f"({statistics.median(wall):6.1f} s wall), {charts} charts", flush=True)
        rows[name] = {"report_cpu_s": round(statistics.median(cpu), 2), "report_cpu_min_s": round(min(cpu), 2),
                      "report_cpu_max_s": round(max(cpu), 2), "report_wall_s": round(statistics.median(wall), 2),
                      "repeats": len(got), "charts": charts}
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--targets", type=int, nargs="*", default=[20, 2000, 20000])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--profile", help="cProfile output of the report of the largest --targets (no timing)")
    ap.add_argument("--folders", type=int, default=0, help="also time one report of this many small run folders")
    ap.add_argument("--small-targets", type=int, default=20, help="targets of each of the --folders runs")
    ap.add_argument("--jobs", type=int, help="report's --jobs (default: report's own, the number of CPUs)")
    ap.add_argument("--keep", help="keep the histories in this folder and reuse them")
    ap.add_argument("--baseline", help="a checkout of an earlier commit, timed interleaved with this one")
    ap.add_argument("--baseline-label", default="baseline", help="its name in the results (e.g. its commit)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--breakdown", action="store_true", help="time each part of the report (report_parts.py)")
    ap.add_argument("--json", help="write the results file here (e.g. benchmarks/results/report_scale.json)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    load = os.getloadavg()[0]
    trees = {"this": ROOT, **({args.baseline_label: Path(args.baseline).resolve()} if args.baseline else {})}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.keep) if args.keep else Path(tmp)
        for n in sorted(args.targets):
            folder = kept(base / f"run{n}_{args.steps}", lambda f, n=n: write_run(f, n, args.steps))
            mb = (folder / "history.jsonl").stat().st_size / 1e6
            if args.profile:
                if n == max(args.targets):
                    time_report(folder, args.profile)
                continue
            measure = broken_down if args.breakdown else timed
            for name, row in measure(f"{n:6d} targets, {args.steps} steps, {mb:7.1f} MB history", folder, args,
                                     trees).items():
                results[f"{n} targets" + ("" if name == "this" else f" ({name})")] = {
                    "steps": args.steps, "history_mb": round(mb, 1), **row}
        if args.folders and not args.profile and not args.breakdown:
            root = kept(base / f"folders{args.folders}x{args.small_targets}_{args.steps}",
                        lambda f: many_folders(f, args.folders, args.small_targets, args.steps))
            for name, row in timed(f"{args.folders} run folders of {args.small_targets} targets", root, args,
                                   trees).items():
                results[f"{args.folders} folders" + ("" if name == "this" else f" ({name})")] = {
                    "targets": args.small_targets, "steps": args.steps, "jobs": args.jobs or os.cpu_count(), **row}
    if args.json and not args.profile:
        results_file.write(args.json, results, results_file.machine(clock="2-core shared CPU (other jobs running), "
                                                                          "CPU time (user + sys) of the report "
                                                                          "process and its workers, and wall clock",
                                                                    load_start=load) +
                           (", each part's exclusive time inside the report process (report_parts.py)"
                            if args.breakdown else "") +
                           ", the report in a fresh process each" +
                           (f"; {args.baseline_label}: the same at that commit" if args.baseline else ""))


if __name__ == "__main__":
    main()
