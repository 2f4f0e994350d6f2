"""The quick benchmark's text table and the machine it ran on."""
import os
import time

import torch

from .timing import clock_name, device
from .variants import BASELINE


def machine():
    import platform
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import hookstats
    gpu = torch.cuda.get_device_name(device()) if torch.device(device()).type == "cuda" else None
    return {"cpu": model, "gpu": gpu, "device": device(), "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "hookstats_backend": hookstats.backend(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "loadavg_start": loadavg(), "clock": clock_name()}


def loadavg():
    """1, 5 and 15 minute load averages: on a shared machine they say how much the timings can be trusted."""
    try:
        with open("/proc/loadavg") as f:
            return [float(v) for v in f.read().split()[:3]]
    except OSError:
        return None


def fmt_mb(b):
    return "-" if b is None else f"{b / 2**20:.1f}"


def ratio_text(r):
    """The ratio column: the median ratio with its IQR, or "within noise" where the IQR reaches 1 or below."""
    if "ratio_q1" not in r:  # results saved before the spread was kept
        return f"{r['ratio']:.3f}"
    spread = f"[{r['ratio_q1']:.3f}..{r['ratio_q3']:.3f}]"
    if r.get("within_noise"):
        if r["repeats"] < 3:
            return f"within noise ({r['repeats']} repeat{'s' * (r['repeats'] > 1)})"
        return f"within noise {spread}"
    return f"{r['ratio']:.3f}x {spread}"


def table(results):
    lines = []
    for w, rows in results["workloads"].items():
        lines.append(f"\n{w}: ms/step median [min..max], ratio to no hooks (median of per-repeat ratios "
                     "[their interquartile range])")
        head = f"{'variant':36} {'ms/step':>22} {'ratio [IQR]':>28} {'syncs/step':>10}"
        has_mem = any("memory" in r for r in rows.values())
        has_gpu = any("cuda_max_allocated" in r.get("memory", {}) for r in rows.values())
        if has_mem:
            head += f" {'peak RSS MB':>11} {'RSS growth MB':>13} {'monitor KB':>10}"
        if has_gpu:
            head += f" {'GPU peak MB':>11}"
        lines.append(head)
        for v, r in rows.items():
            s = (f"{v:36} {r['median_ms']:8.1f} [{r['min_ms']:5.1f}..{r['max_ms']:5.1f}] "
                 f"{'1 (baseline)' if v == BASELINE else ratio_text(r):>28} {r['syncs_per_step']:10.1f}")
            if has_mem and "memory" in r:
                m = r["memory"]
                growth = max(m["rss"].values()) - m["rss_start"]
                mon = "-" if m.get("monitor_bytes") is None else f"{m['monitor_bytes'] / 1024:.1f}"
                s += f" {fmt_mb(m['peak_rss']):>11} {fmt_mb(growth):>13} {mon:>10}"
                if has_gpu:
                    s += f" {fmt_mb(m.get('cuda_max_allocated')):>11}"
            lines.append(s)
    if any(r.get("within_noise") for rows in results["workloads"].values() for v, r in rows.items() if v != BASELINE):
        lines.append("\nwithin noise: the interquartile range of the per-repeat ratios reaches 1 (or below: hookstats "
                     "adds work, so a ratio < 1 is the machine's drift, not a speedup), or fewer than 3 repeats; "
                     "run more --repeats, with --threads 1 --clock cpu on a shared machine.")
    m = results["machine"]
    gpu = f"{m['gpu']} ({m['device']}), " if m.get("gpu") else ""
    lines.append(f"\n{gpu}{m['cpu']}, {m['cores']} cores ({m['torch_threads']} torch threads), torch {m['torch']}, "
                 f"hookstats backend {m['hookstats_backend']}, {m['clock']} clock, {m['date']}, "
                 f"load average {m['loadavg_start']}")
    return "\n".join(lines)
