"""The command line: `python -m hookstats demo|report|bench`. Bad arguments and paths end with one line
on stderr and exit status 2, never a traceback."""
import argparse
import importlib
import sys
import warnings
from pathlib import Path

from .sinks import HISTORY_CSV, HISTORY_JSONL


class UsageError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _int_at_least(lo):
    def parse(text):
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {v}")
        return v
    return parse


def make_parser():
    p = Parser(prog="hookstats", description="Activation and gradient statistics for PyTorch training.")
    sub = p.add_subparsers(dest="command", metavar="{demo,report,bench}", parser_class=Parser)
    sub.required = True
    d = sub.add_parser("demo", help="train a small CNN and transformer with every target measured",
                       description="Trains a small CNN and a small transformer on synthetic data on the best "
                                   "available device with every target measured; writes TensorBoard logs, "
                                   "CSV/JSONL history, charts, the summary table and the alerts to --out.")
    d.add_argument("--out", default="hookstats-demo", help="output folder (default: ./hookstats-demo)")
    d.add_argument("--steps", type=_int_at_least(1), default=100, help="training steps per model (default: 100)")
    d.add_argument("--device", help="cpu, cuda, cuda:1, mps (default: the best available)")
    d.add_argument("--models", nargs="+", choices=["cnn", "transformer"], default=["cnn", "transformer"])
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--nan-at", type=_int_at_least(0), metavar="STEP", help="put a NaN into a weight at this step "
                                                                       "to see the alert")
    d.add_argument("--no-tensorboard", action="store_true", help="skip the TensorBoard logs")
    d.add_argument("--no-progress", action="store_true", help="no progress bar")
    r = sub.add_parser("report", help="rebuild charts and tables from a saved run folder",
                       description="Rebuilds the charts and tables of a run from its history.jsonl (or "
                                   "history.csv: scalar charts only). RUN_DIR is a run folder or a folder of runs "
                                   "(like the demo's output).")
    r.add_argument("run_dir", metavar="RUN_DIR")
    r.add_argument("--out", help="write charts here instead of RUN_DIR/<run>/charts")
    sub.add_parser("bench", help="benchmarks (options: hookstats bench --help)", add_help=False)
    return p


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        return _bench(argv[1:])
    args = make_parser().parse_args(argv)
    try:
        if args.command == "demo":
            return _demo(args)
        return _report(args)
    except UsageError as e:
        print(f"hookstats {args.command}: error: {e}", file=sys.stderr)
        return 2


def _bench(argv):
    try:
        bench = importlib.import_module("hookstats.bench")
    except ImportError as e:
        print(f"hookstats bench: error: the benchmark module is not available ({e})", file=sys.stderr)
        return 2
    if not callable(getattr(bench, "main", None)):
        print("hookstats bench: error: hookstats.bench has no main(argv)", file=sys.stderr)
        return 2
    return bench.main(argv)


def _demo(args):
    import torch

    from . import demo
    if args.device is not None:
        try:
            dev = torch.device(args.device)
            torch.empty(0, device=dev)
        except (RuntimeError, AssertionError) as e:
            raise UsageError(f"device {args.device!r} is not usable here: {str(e).splitlines()[0]}") from None
    if args.nan_at is not None and args.nan_at >= args.steps:
        raise UsageError(f"--nan-at {args.nan_at} is not a step of this run (steps 0..{args.steps - 1})")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--out {out}: cannot make the folder ({e.strerror or e})") from None
    demo.run(out=out, steps=args.steps, device=args.device, models=args.models, seed=args.seed,
             nan_at=args.nan_at, tensorboard=not args.no_tensorboard, progress=not args.no_progress)
    return 0


def _report(args):
    root = Path(args.run_dir)
    if not root.is_dir():
        raise UsageError(f"no such folder: {root}")
    runs = find_runs(root)
    if not runs:
        raise UsageError(f"{root} holds no history.jsonl or history.csv (nor do its subfolders)")
    for run in runs:
        out = None
        if args.out:
            out = Path(args.out) if run == root else Path(args.out) / run.name
        try:
            report(run, out)
        except (ValueError, KeyError, OSError) as e:
            raise UsageError(f"{run}: {e}") from None
    return 0


def find_runs(root):
    """root itself if it holds a history file, else its subfolders that do."""
    def has(d):
        return (d / HISTORY_JSONL).is_file() or (d / HISTORY_CSV).is_file()
    return [root] if has(root) else sorted(d for d in root.iterdir() if d.is_dir() and has(d))


def load_run(run_dir, warn=None):
    """(items, alerts) of a run folder; each file's skipped torn lines are said in one line through warn
    (default: stderr)."""
    from .sinks import SkippedLinesWarning, read_history
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SkippedLinesWarning)
        loaded = read_history(run_dir)
    for w in caught:
        if issubclass(w.category, SkippedLinesWarning):
            (warn or _stderr)(f"hookstats report: warning: {w.message}")
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return loaded


def _stderr(msg):
    print(msg, file=sys.stderr)


def report(run_dir, out=None, log=print):
    """Charts and tables of one run folder from history.jsonl (histograms included) or history.csv."""
    from . import plots
    from .history import brief
    from .summary import stats_table
    items, alerts = load_run(run_dir)
    if not items:
        raise ValueError("the history holds no steps")
    series = plots.collect(items)
    paths = plots.save_all(series, out or run_dir / "charts")
    last = {}
    for step, rec in items:
        if step >= last.get(rec["target"], (-1, None))[0]:
            last[rec["target"]] = (step, rec)
    steps = sorted({s for s, _ in items})
    log(f"== {run_dir}: {len(steps)} recorded steps ({steps[0]}..{steps[-1]}), {len(series)} targets")
    log(stats_table([r for _, r in last.values()], title="last recorded step of each target"))
    msgs = brief(alerts)
    log(f"alerts ({len(alerts)}):" + "".join(f"\n  {m}" for m in msgs) if alerts else "alerts: none")
    log(f"wrote {len(paths)} charts to {out or run_dir / 'charts'}")
    return paths
