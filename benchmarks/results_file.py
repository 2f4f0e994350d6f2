"""The one shape of a file under benchmarks/results/, which docs/_ext/results.py renders on the performance page:

    {"machine": str, "torch": str, "commit": str, "command": str, "results": {row: {field: value}}}

`machine` says what the figures ran on (CPU or GPU, cores, torch threads, the clock, load average at start and
end); `command` is what reproduces the file from the repository's root."""
import json
import os
import subprocess
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def commit():
    """HEAD's short hash, with "+changes" when the measured code (hookstats/, csrc/, setup.py) differs from it."""
    def git(*args):
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no", "--", "hookstats", "csrc", "setup.py") else "")


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        import platform
        return platform.processor() or platform.machine()


def machine(clock="the thread's CPU clock", load_start=None, device=None):
    """One line: the processor (and GPU), cores, torch threads, the clock, load average at start -> now."""
    parts = [cpu_name()]
    if device is not None and torch.device(device).type == "cuda":
        parts.append(torch.cuda.get_device_name(device))
    parts += [f"{os.cpu_count()} cores", f"torch threads: {torch.get_num_threads()}", clock]
    if load_start is not None:
        parts.append(f"load average {load_start:.1f} -> {os.getloadavg()[0]:.1f}")
    return ", ".join(parts)


def command(argv=None):
    """The command line that ran this script, as run from the repository's root."""
    script = os.path.relpath(os.path.abspath(sys.argv[0]), ROOT)
    args = sys.argv[1:] if argv is None else list(argv)
    env = "OMP_NUM_THREADS=1 " if os.environ.get("OMP_NUM_THREADS") == "1" else ""
    return " ".join([f"{env}PYTHONPATH=. python {script}", *args])


def write(path, results, machine_line, argv=None):
    """Writes `results` ({row: {field: value}}) in the shape above."""
    bad = [r for r, v in results.items() if not isinstance(v, dict)]
    if bad:
        raise TypeError(f"results rows must be dicts of fields, not {bad}")
    data = {"machine": machine_line, "torch": torch.__version__, "commit": commit(), "command": command(argv),
            "results": results}
    with open(path, "w") as f:
        json.dump(data, f, indent=1, default=str)
        f.write("\n")
    return data
