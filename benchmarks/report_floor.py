"""The floor under `python -m hookstats report`: CPU time (user + sys) of a fresh Python process that does what every
report does before it reads a byte (start the interpreter, import what the report imports) and then draws one empty
chart (a 15x7-inch figure with one axes, saved as PNG as the charts are), each in a fresh process, medians over
--repeats with their min and max. With the checkout's own PYTHONPATH; --json writes a results file.

  OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/report_floor.py --repeats 5 \
      --json benchmarks/results/report_floor.json"""
import argparse
import os
import resource
import statistics
import subprocess
import sys

import results_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = {
    "python": "pass",
    "imports": "import matplotlib; matplotlib.use('Agg'); import matplotlib.figure; "
               "from hookstats.tools import cli, plots, run_charts, tables; import hookstats.sinks, hookstats.records, "
               "hookstats.delivery, hookstats.grad_norms, hookstats.tools.lowprec_plots, tqdm",
}
STEPS["imports and one empty chart"] = STEPS["imports"] + (
    "; import tempfile, os; from hookstats.tools.plots import new_figure, save_figure; "
    "fig = new_figure(figsize=(15, 7)); fig.subplots(1, 1); "
    "save_figure(fig, os.path.join(tempfile.mkdtemp(), 'empty.png'))")


def cpu_of(code):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "PYTHONPATH": ROOT, "MPLBACKEND": "Agg"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", help="write the results file here")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    got = {name: [] for name in STEPS}
    for _ in range(args.repeats):  # interleaved
        for name, code in STEPS.items():
            got[name].append(cpu_of(code))
    results = {}
    for name, cpu in got.items():
        results[name] = {"cpu_s": round(statistics.median(cpu), 3), "cpu_min_s": round(min(cpu), 3),
                         "cpu_max_s": round(max(cpu), 3), "repeats": len(cpu)}
        print(f"{name:30s} {statistics.median(cpu):6.2f} s CPU [{min(cpu):.2f}..{max(cpu):.2f}]")
    if args.json:
        results_file.write(args.json, results, results_file.machine(
            clock="CPU time (user + sys) of a fresh process each", load_start=load))


if __name__ == "__main__":
    main()
