"""`python -m hookstats bench`: the quick benchmark table (every variant on each workload: interleaved step
times, host syncs, memory in a fresh process each), with a progress bar on stderr."""
import argparse
import json
import os
from pathlib import Path

import torch

from ..args import Parser, comma_list, int_in, progress_argument
from ..progress import progress
from .memory import measure_memory, memory_child
from .models import check_workload
from .syncs import count_syncs
from .table import machine, table
from .timing import CLOCKS, interleaved_step_times, set_clock, set_device, summarize
from .variants import BASELINE, LABELS, VARIANT_LIST, available_variants


def run(workloads, variants, repeats, steps, memory_steps, show_progress=True):
    """{"machine", "workloads": {workload: {variant label: row}}}; variants are labels, the baseline first."""
    results = {"machine": machine(), "workloads": {}}
    per_variant = repeats + 1 + bool(memory_steps)  # timed repeats, the sync count, the memory run
    with progress(total=len(workloads) * len(variants) * per_variant, unit="run", enabled=show_progress) as bar:
        def tick(done):
            bar.set_postfix_str(f"done: {done}", refresh=False)
            bar.update()
        for w in workloads:
            bar.set_description(w)
            times = interleaved_step_times(w, variants, repeats=repeats, steps=steps,
                                           tick=lambda v: tick(f"timing {v}"))
            rows = {}
            for v in variants:
                rows[v] = summarize(times[v], times[BASELINE])
                rows[v]["syncs_per_step"], rows[v]["sync_ops"] = count_syncs(w, v)
                tick(f"host syncs of {v}")
                if memory_steps:
                    rows[v]["memory"] = measure_memory(w, v, memory_steps)
                    tick(f"memory of {v}")
            results["workloads"][w] = rows
    return results


def variant_name(name):
    if name not in LABELS:
        raise ValueError(f"unknown variant {name!r}")
    return name


# measured: `python -m hookstats bench --no-progress` (every default) on the CPU machine the benchmarks ran on
DEFAULT_RUN_TIME = ("The default run (cnn and transformer, every variant, 3 repeats, a memory run per variant in a\n"
                    "fresh process) takes about 30 minutes on a 2-core CPU machine shared with other jobs\n"
                    "(load average 4-10); --workloads, --variants and --memory-steps 0 shorten it.")


def _writable_file(text):
    folder = Path(text).parent
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text}: {folder} is not a writable folder")
    return text


def _epilog():
    names = "\n".join(f"  {v.name:20} {v.label}" + ("  (the baseline, always run)" if v.label == BASELINE else "")
                      for v in VARIANT_LIST)
    return (f"variants (--variants takes the names on the left; tables show the labels on the right):\n{names}\n"
            "the fastai ones need fastai installed.\n\n"
            "workloads: cnn (6 conv/bn/relu, batch 64 of 3x32x32), transformer (4 blocks, d=256, seq 128,\n"
            "batch 16), stackN (N Linear(32, 32) + ReLU layers).")


def make_parser(prog="hookstats bench"):
    p = Parser(prog=prog, epilog=_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter,
               description="Training-step time, host syncs and memory of hookstats against fastai ActivationStats,\n"
                           "detach-to-CPU hooks and a wandb.watch-style hook (quick version; the full suite is\n"
                           "benchmarks/ in the repository). On a loaded machine use --threads 1 --clock cpu.\n"
                           f"{DEFAULT_RUN_TIME}")
    p.add_argument("--workloads", type=comma_list(check_workload), default="cnn,transformer",
                   help="comma list of cnn, transformer, stackN (default: %(default)s)")
    p.add_argument("--variants", type=comma_list(variant_name), default=None,
                   help="comma list of the names below (default: all available; none, the baseline, always runs)")
    p.add_argument("--repeats", type=int_in(1), default=3,
                   help="interleaved rounds of every variant (default: %(default)s)")
    p.add_argument("--steps", type=int_in(1), default=10,
                   help="timed steps per variant per round; any 10 consecutive steps hold exactly one histogram "
                        "step of the default hist_every=10 (default: %(default)s)")
    p.add_argument("--memory-steps", type=int_in(0), default=20,
                   help="steps of each variant's memory run, in a fresh process (0: no memory runs; "
                        "default: %(default)s)")
    p.add_argument("--json", type=_writable_file, default=None, help="also write the results to this file")
    p.add_argument("--threads", type=int_in(1), default=None, help="torch threads (default: torch's)")
    p.add_argument("--clock", default="wall", choices=list(CLOCKS),
                   help="cpu: the thread's CPU time, for a loaded shared machine (needs --threads 1; "
                        "default: %(default)s)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]: where the models train (default: %(default)s)")
    progress_argument(p)
    p.add_argument("--memory-child", nargs=4, help=argparse.SUPPRESS)
    return p


def main(argv=None, prog="hookstats bench"):
    p = make_parser(prog)
    a = p.parse_args(argv)
    try:
        set_device(a.device)
    except (RuntimeError, ValueError) as e:
        p.error(f"--device {a.device}: {str(e).splitlines()[0]}")
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.memory_child:
        w, v, steps, cps = a.memory_child
        print(json.dumps(memory_child(w, v, int(steps), [int(c) for c in cps.split(",")])))
        return 0
    try:
        set_clock(a.clock)
    except ValueError as e:
        p.error(f"--clock {a.clock}: {e}")
    names = [v.name for v in VARIANT_LIST] if a.variants is None else a.variants
    labels = [LABELS[n] for n in names]
    missing = [n for n, label in zip(names, labels) if label not in available_variants()]
    if a.variants is not None and missing:
        p.error(f"--variants: {', '.join(missing)} need fastai, which is not installed")
    labels = [BASELINE] + [label for label in labels if label != BASELINE and label in available_variants()]
    results = run(a.workloads, labels, a.repeats, a.steps, a.memory_steps, show_progress=not a.no_progress)
    print(table(results))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0

