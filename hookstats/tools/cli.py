"""The command line: `python -m hookstats demo|report|bench`. Bad arguments and paths end with one line
on stderr and exit status 2, never a traceback."""
import contextlib
import gc
import importlib
import os
import sys
import warnings
from pathlib import Path

from ..extras import MissingExtra, require
from ..sinks import HISTORY_CSV, HISTORY_JSONL
from .args import Parser, int_in, progress_argument


TABLE_FILE = "last_step_table.txt"  # report's table of every target, beside the charts
TABLE_ENDS = 15  # rows printed from each end of a longer table


class UsageError(Exception):
    pass


class Command:
    """One subcommand: its help line, add_arguments(parser) and run(args) -> exit status. A command with
    run_argv instead takes its raw arguments and parses them itself (bench, whose module loads on use)."""

    def __init__(self, help, description=None, add_arguments=None, run=None, run_argv=None):
        self.help, self.description = help, description
        self.add_arguments, self.run, self.run_argv = add_arguments, run, run_argv


def _demo_arguments(d):
    d.add_argument("--out", default="hookstats-demo", help="output folder (default: ./%(default)s)")
    d.add_argument("--steps", type=int_in(1), default=60, help="training steps per model (default: %(default)s)")
    d.add_argument("--device", help="cpu, cuda, cuda:1, mps (default: the best available)")
    d.add_argument("--models", nargs="+", choices=["cnn", "transformer"], default=["cnn", "transformer"],
                   help="which models to train (default: both)")
    d.add_argument("--seed", type=int_in(0, 2**64 - 1), default=0, help="random seed (default: %(default)s)")
    d.add_argument("--nan-at", type=int_in(0), metavar="STEP", help="put a NaN into a weight at this step "
                                                                     "to see the alert")
    d.add_argument("--no-tensorboard", action="store_true", help="skip the TensorBoard logs")
    progress_argument(d)


def _report_arguments(r):
    r.add_argument("run_dir", metavar="RUN_DIR")
    r.add_argument("--out", help="write charts here instead of RUN_DIR/<run>/charts")
    r.add_argument("--jobs", type=int_in(1), metavar="N",
                   help="run folders reported at once, each in a process of its own (default: the number of CPUs; "
                        "1: one after another in this process). A single run is always reported in this process")
    progress_argument(r)


def _bench(argv):
    try:
        bench = importlib.import_module("hookstats.tools.bench")
    except ImportError as e:
        print(f"hookstats bench: error: the benchmark module is not available ({e})", file=sys.stderr)
        return 2
    if not callable(getattr(bench, "main", None)):
        print("hookstats bench: error: hookstats.tools.bench has no main(argv)", file=sys.stderr)
        return 2
    return bench.main(argv)


def _demo(args):
    import torch

    from . import demo
    require("matplotlib", "hookstats demo (its charts)")
    if not args.no_tensorboard:
        require("tensorboard", "hookstats demo (its TensorBoard logs; or run it with --no-tensorboard)")
    if args.device is not None:
        try:
            dev = torch.device(args.device)
            torch.empty(0, device=dev)
        except (RuntimeError, AssertionError) as e:
            raise UsageError(f"device {args.device!r} is not usable here: {str(e).splitlines()[0]}") from None
        if dev.type == "meta":
            raise UsageError("device 'meta' holds no values to train on: cpu, cuda or mps")
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
    if not root.is_dir() and not root.is_file():
        raise UsageError(f"no such folder or history file: {root}")
    runs = [root] if root.is_file() else find_runs(root)
    if not runs:
        raise UsageError(f"{root} holds no history.jsonl or history.csv (nor do its subfolders)")
    if args.out is not None and not args.out.strip():
        raise UsageError("--out is empty: give a folder, or leave --out out to write to RUN_DIR/<run>/charts")
    # the folder to write to is the user's --out and the run folder's own name, never a name read from a file
    tasks = [(run, None if args.out is None else Path(args.out) if run == root else Path(args.out) / run.name)
             for run in runs]
    jobs = min(args.jobs or os.cpu_count() or 1, len(tasks))
    if jobs > 1:
        require("matplotlib", "hookstats charts")  # one line here, not one per process
        from .report_jobs import report_in_processes
        failed = report_in_processes(tasks, jobs, report_quietly, show_progress=not args.no_progress, log=print,
                                     warn=_stderr)
        if failed is not None:
            raise UsageError(failed)
        return 0
    for run, out in tasks:
        try:
            report(run, out, show_progress=not args.no_progress)
        except (ValueError, KeyError, OSError) as e:
            raise UsageError(f"{run}: {e}") from None
    return 0


def report_quietly(run, out):
    """report() of one run in a worker process (report_jobs): (what it printed and warned, in order, as (stream,
    text) pairs; its error line or None)."""
    said = []
    try:
        report(run, out, log=lambda text: said.append(("out", text)), warn=lambda text: said.append(("err", text)))
    except (ValueError, KeyError, OSError) as e:
        return said, f"{run}: {e}"
    return said, None


def find_runs(root):
    """root itself if it holds a history file, else its subfolders that do."""
    def has(d):
        return (d / HISTORY_JSONL).is_file() or (d / HISTORY_CSV).is_file()
    return [root] if has(root) else sorted(d for d in root.iterdir() if d.is_dir() and has(d))


def load_run(run_dir, warn=None, progress=None):
    """(history, alerts) of a run folder, the history read as columns (hookstats.sinks.Columns); what its file holds
    beyond whole records of one run (torn lines, bad fields, several runs, duplicates, incomplete steps:
    hookstats.sinks.HistoryFileWarning) is said one line each through warn (default: stderr). progress(n): n more
    bytes of the history file read."""
    from ..sinks import HistoryFileWarning, read_history_columns
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", HistoryFileWarning)
        loaded = read_history_columns(run_dir, progress)
    for w in caught:
        if issubclass(w.category, HistoryFileWarning):
            (warn or _stderr)(f"hookstats report: warning: {w.message}")
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return loaded


def _size(path):
    """The file's size in bytes, None where it has none to read (read_history then says why)."""
    try:
        return path.stat().st_size
    except OSError:
        return None


def _stderr(msg):
    print(msg, file=sys.stderr)


def report(run_dir, out=None, log=print, show_progress=False, warn=None):
    """Charts and tables of one run folder from history.jsonl (histograms included) or history.csv, or of one
    history file (charts beside it, in charts/). log: the printed lines; warn: what the file holds beyond whole
    records of one run (load_run; default: stderr)."""
    import numpy as np
    with np.errstate(all="ignore"), _long_lived() as freeze:  # values at float64's ends are legal: no NumPy warning
        return _report_run(run_dir, out, log, show_progress, warn, freeze)


@contextlib.contextmanager
def _long_lived():
    """Yields freeze(): the objects alive when it is called (the imported modules; then the history read and its
    series) leave the cyclic collector's full collections, which would walk them again and again while the charts
    are drawn (up to 0.5 s of a 2,000-target report, timed with the collector off), until the report is done. A
    caller's own gc.freeze() is left alone."""
    if gc.get_freeze_count():
        yield lambda: None
        return
    gc.freeze()
    try:
        yield gc.freeze
    finally:
        gc.unfreeze()


def _report_run(run_dir, out, log, show_progress, warn, freeze):
    import numpy as np
    from . import plots
    from ..delivery import brief
    from .progress import progress
    from ..records import last_records
    from .tables import FLOAT_CELLS, head_and_tail, stats_table
    from .run_charts import flight_charts, grad_norms_chart, save_run_charts
    from ..grad_norms import grad_norms
    from ..sinks import history_file
    history = history_file(run_dir)
    # a large history takes longer to read than its charts to draw: the bar counts its bytes as they are read
    with progress(total=_size(history), desc=f"reading {history.name}", unit="B", unit_scale=True,
                  enabled=show_progress) as bar:
        items, alerts = load_run(run_dir, warn, progress=bar.update)
    if not len(items):
        raise ValueError("the history holds no steps")
    series = plots.series_of(items)
    freeze()
    out = out or (run_dir if run_dir.is_dir() else run_dir.parent) / "charts"
    extras = flight_charts(run_dir if run_dir.is_dir() else run_dir.parent) + grad_norms_chart(grad_norms(items))
    paths = save_run_charts(series, items, out, extras=extras, bar=lambda: progress(
        desc=f"charts of {run_dir.name}", unit="chart", enabled=show_progress))
    # per target and phase: its last train step, its last validation pass
    rows, last_buckets = last_records(items, [k for k, _ in FLOAT_CELLS.values()])
    steps = np.unique(items.steps).tolist()
    log(f"== {run_dir}: {len(steps)} recorded steps ({steps[0]}..{steps[-1]}), {len(series)} targets")
    title = "last recorded step of each target" + (" (|x| quantiles and near 0 rel: its last histogram "
                                                    "step)" if last_buckets else "")
    table = stats_table(rows, title=title)
    (out / TABLE_FILE).write_text(table + "\n", encoding="utf-8")
    # a model's thousands of targets would scroll everything else off the terminal: the file has them all
    log(head_and_tail(table, TABLE_ENDS, f"the whole table is in {out / TABLE_FILE}"))
    msgs = brief(alerts)
    log(f"alerts ({len(alerts)}):" + "".join(f"\n  {m}" for m in msgs) if alerts else "alerts: none")
    log(f"wrote {len(paths)} charts and {TABLE_FILE} to {out}")
    return paths


def _plan(argv):
    from .planner import main as plan
    return plan(argv)


COMMANDS = {
    "demo": Command("train a small CNN and transformer with every target measured",
                    "Trains a small CNN and a small transformer on synthetic data on the best available device "
                    "with every target measured; writes TensorBoard logs, CSV/JSONL history, charts, the summary "
                    "table and the alerts (alerts.txt, only when there are any) to --out.",
                    _demo_arguments, _demo),
    "report": Command("rebuild charts and tables from a saved run folder",
                      "Rebuilds the charts and tables of a run from its history.jsonl (or history.csv: scalar "
                      "charts only). RUN_DIR is a run folder, a folder of runs (like the demo's output) or a "
                      "history file.",
                      _report_arguments, _report),
    "bench": Command("benchmarks against fastai, detach-to-CPU and wandb-style hooks (hookstats bench --help)",
                     run_argv=_bench),
    "plan": Command("what attach() would measure and cost, without running the model (hookstats plan --help)",
                    run_argv=_plan),
}


def make_parser():
    p = Parser(prog="hookstats", description="Activation and gradient statistics for PyTorch training.")
    sub = p.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}", parser_class=Parser)
    sub.required = True
    for name, cmd in COMMANDS.items():
        c = sub.add_parser(name, help=cmd.help, description=cmd.description, add_help=cmd.run_argv is None)
        if cmd.add_arguments is not None:
            cmd.add_arguments(c)
    return p


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in COMMANDS and COMMANDS[argv[0]].run_argv is not None:
        try:
            return COMMANDS[argv[0]].run_argv(argv[1:])
        except MissingExtra as e:
            return _missing(argv[0], e)
    args = make_parser().parse_args(argv)
    try:
        return COMMANDS[args.command].run(args)
    except UsageError as e:
        print(f"hookstats {args.command}: error: {e}", file=sys.stderr)
        return 2
    except MissingExtra as e:
        return _missing(args.command, e)


def _missing(command, error):
    """An optional dependency is not installed: one line with the command that installs it, status 1."""
    print(f"hookstats {command}: error: {error}", file=sys.stderr)
    return 1
