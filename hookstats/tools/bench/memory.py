"""Memory of a variant: each run in a fresh process (`python -m hookstats.tools.bench --memory-child ...`), so
that one variant's peak never hides another's: RSS over the steps, its peak, the monitor's own bytes."""
import json
import subprocess
import sys

import torch

from .models import make_workload
from .timing import device, sync
from .variants import VARIANTS, hooked_modules


def proc_status_bytes(field):
    """VmRSS (now) or VmHWM (peak) of this process; ru_maxrss would include the parent's peak at fork."""
    with open("/proc/self/status") as f:
        line = next(ln for ln in f if ln.startswith(field + ":"))
    return int(line.split()[1]) * 1024


def rss_bytes():
    return proc_status_bytes("VmRSS")


def memory_child(workload, variant, steps, checkpoints):
    """Runs in its own process: RSS after warm-up and at each checkpoint, the peak, the monitor's bytes."""
    model, step = make_workload(workload, device=device())
    inst = VARIANTS[variant](model)
    step()
    inst.after_step()
    sync()
    out = {"rss_start": rss_bytes(), "rss": {}}
    for k in range(1, steps + 1):
        step()
        inst.after_step()
        if k in checkpoints:
            out["rss"][k] = rss_bytes()
    out["peak_rss"] = proc_status_bytes("VmHWM")
    out["monitor_bytes"] = inst.memory() if inst.memory else None
    if out["monitor_bytes"] is not None:
        out["targets"] = len(hooked_modules(model))
    if torch.device(device()).type == "cuda":
        sync()
        out["cuda_max_allocated"] = torch.cuda.max_memory_allocated(device())
    inst.remove()
    return out


def measure_memory(workload, variant, steps, checkpoints=None):
    if steps < 1:
        raise ValueError(f"memory runs need steps >= 1, got {steps}")
    checkpoints = sorted(set(checkpoints or [steps]) | {steps})
    cmd = [sys.executable, "-m", "hookstats.tools.bench", "--memory-child", workload, variant, str(steps),
           ",".join(map(str, checkpoints)), "--threads", str(torch.get_num_threads()), "--device", device()]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if res.returncode != 0:
        raise RuntimeError(f"memory run of {variant!r} on {workload} failed:\n{res.stderr[-2000:]}")
    out = json.loads(res.stdout.strip().splitlines()[-1])
    out["rss"] = {int(k): v for k, v in out["rss"].items()}
    return out
