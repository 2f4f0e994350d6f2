"""CPU time (time.process_time, one thread) of drawing every chart of plots.save_all for each run folder given (e.g.
the demo's cnn/ and transformer/), in a fresh process per checkout and round, the checkouts interleaved; reading the
history and the imports are outside the timed span. Prints, or writes with --json, the median, min and max per
checkout.

  OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/chart_time.py RUN [RUN ...] --baseline ../base --repeats 3"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHILD = """
import sys, time, tempfile
import matplotlib
matplotlib.use("Agg")
from hookstats.tools import plots
from hookstats.sinks import read_history_columns
spent, charts = 0.0, 0
for run in sys.argv[1:]:
    series = plots.series_of(read_history_columns(run)[0])
    with tempfile.TemporaryDirectory() as out:
        t = time.process_time()
        charts += len(plots.save_all(series, out))
        spent += time.process_time() - t
print(spent, charts)
"""


def one(tree, runs):
    env = {**os.environ, "PYTHONPATH": str(tree), "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", CHILD, *map(str, runs)], capture_output=True, text=True, env=env)
    if r.returncode:
        raise SystemExit(r.stderr[-2000:])
    cpu, charts = r.stdout.split()
    return float(cpu), int(charts)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="run folders (each holding a history.jsonl)")
    ap.add_argument("--baseline", help="a checkout of an earlier commit, timed interleaved with this one")
    ap.add_argument("--baseline-label", default="baseline")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    trees = {"this": ROOT, **({args.baseline_label: Path(args.baseline)} if args.baseline else {})}
    got = {k: [] for k in trees}
    charts = {}
    for _ in range(args.repeats):
        for label, tree in trees.items():
            cpu, charts[label] = one(tree, args.runs)
            got[label].append(cpu)
            print(label, round(cpu, 2), flush=True)
    out = {label: {"charts": charts[label], "cpu_s": round(statistics.median(v), 2), "cpu_min_s": round(min(v), 2),
                   "cpu_max_s": round(max(v), 2), "repeats": len(v)} for label, v in got.items()}
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
