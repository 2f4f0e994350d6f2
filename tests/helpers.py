"""Test helpers shared by the test files: a float64 NumPy oracle of the op and a no-host-sync guard."""
import contextlib
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from float_oracle import float_buckets
from torch.utils._python_dispatch import TorchDispatchMode

import hookstats
from hookstats import layout, rawstate

F32_MAX = float(np.finfo(np.float32).max)


def bin_values(v, dtype):
    """The float32 values the kernels bin (float64 inputs: huge stay finite, tiny stay nonzero)."""
    with np.errstate(over="ignore"):
        if dtype != torch.float64:
            return v.astype(np.float32)
        f = np.where(np.isfinite(v), np.clip(v, -F32_MAX, F32_MAX), v).astype(np.float32)
        tiny = np.copysign(np.float32(1e-45), v).astype(np.float32)
        return np.where((f == 0) & (v != 0), tiny, f).astype(np.float32)


def oracle(x, cfg):
    """Statistics of tensor x computed independently in NumPy float64: returns (fstate, istate) arrays, the istate
    laid out as README and csrc/accumulator.h say, written out here: the op counters (count, near_zero, ...: one
    slot each, in the order of their rows, rawstate.COUNTERS), [under, nbins bins, over] with the linear bins, NaN,
    +Inf, -Inf, [256 log2 slots] where the op keeps its own, [4096 float buckets]."""
    parts = oracle_parts(x, cfg)
    nb = cfg.nbins
    lin = parts["lin"] if cfg.linear_hist else parts["lin"][nb + 2:]
    extra = [parts[k] for k in ("log2", "float") if parts[k] is not None]
    counters = [parts[name] for name in rawstate.COUNTERS]
    return parts["fstate"], np.concatenate([counters, lin, *extra]).astype(np.int64)


def oracle_parts(x, cfg):
    """The oracle's statistics by name: fstate, each op counter (count, near_zero, ...), lin (the kernels' numbering: under, nbins bins,
    over, NaN, +Inf, -Inf; the bins zero without linear_hist), log2 (256 slots, None where the op keeps none:
    without log_hist, or with the float buckets) and float (4096 buckets, None without them)."""
    dtype = x.dtype
    v = x.detach().double().reshape(-1).numpy()
    nb = cfg.nbins
    fin = np.isfinite(v)
    vf = v[fin]
    f = np.array([0.0, 0.0, 0.0, np.nan, np.nan])
    if vf.size:
        mean = vf.mean()
        f = np.array([vf.size, mean, ((vf - mean) ** 2).sum(), vf.min(), vf.max()])
    out = {"fstate": f, "count": v.size, "log2": None, "float": None}
    b = bin_values(v, dtype)
    with np.errstate(invalid="ignore"):
        a = b if cfg.near_zero == "le" else np.abs(b)
        out["near_zero"] = int((a <= np.float32(cfg.eps)).sum())
    lin = np.zeros(nb + 5, dtype=np.int64)
    lin[nb + 2] = np.isnan(v).sum()
    lin[nb + 3] = np.isposinf(v).sum()
    lin[nb + 4] = np.isneginf(v).sum()
    if cfg.linear_hist:
        t = (b[fin] - np.float32(cfg.lo32)) * np.float32(cfg.inv_w)  # float32 arithmetic, as the kernels
        slots = np.floor(np.clip(t, -1, nb)).astype(np.int64) + 1
        lin += np.bincount(slots, minlength=nb + 5)
    out["lin"] = lin
    if cfg.log_hist and not cfg.float_hist:  # with float buckets the op keeps no log2 slots
        bf = np.abs(b[fin]).astype(np.float64)
        _, e = np.frexp(bf)  # |x| in [2**(e-1), 2**e)
        slots = np.where(bf == 0, 0, np.where(bf < 2.0 ** -126, 1, e - 1 - layout.LOG_EXP_MIN + 2))
        out["log2"] = np.bincount(slots, minlength=256)
    if cfg.float_hist:
        out["float"] = float_buckets(x)
    return out


def cpu_kernels():
    """The CPU kernels this machine runs, the one chosen by default last: portable always, avx2 where the CPU has
    AVX2, FMA and F16C, avx512 where it also has AVX-512 F, BW, VL and DQ (read from /proc/cpuinfo, not the op)."""
    flags = set()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            flags = set(re.search(r"^flags\s*:(.*)$", f.read(), re.M).group(1).split())
    kernels = ["portable"]
    if {"avx2", "fma", "f16c"} <= flags:
        kernels.append("avx2")
        if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
            kernels.append("avx512")
    return kernels


def without_histograms(istate, cfg):
    """An oracle istate (oracle()) as a call whose enabled flag has SKIP_HIST leaves it: the op counters and the
    NaN/Inf counts; the linear bins (under, bins, over), log2 slots and float buckets zero. Laid out as oracle()
    writes it: NaN follows the op counters and, with the linear bins, their nbins + 2 slots."""
    i = np.zeros_like(istate)
    nc = len(rawstate.COUNTERS)
    nan = nc + (cfg.nbins + 2 if cfg.linear_hist else 0)
    i[:nc] = istate[:nc]
    i[nan: nan + 3] = istate[nan: nan + 3]
    return i


CPU_KERNELS = ["portable", "avx2", "avx512"]


def failure_with_kernel(test_file, select, kernel):
    """The tests of test_file matching `-k select` under CPU kernel `kernel`: a failure message, or None when they
    passed. The kernel this CPU runs by default is the one of this process (checked to be the best it has); the
    others are forced with HOOKSTATS_CPU_KERNEL in a new process, as CPUs without the faster ones run them."""
    if kernel not in cpu_kernels():
        pytest.skip(f"this CPU cannot run the {kernel} kernel")
    if kernel == cpu_kernels()[-1] and "HOOKSTATS_CPU_KERNEL" not in os.environ:
        hookstats.backend()  # loads the op (import hookstats does not)
        chosen = torch.ops.hookstats.cpu_kernel()
        return None if chosen == kernel else f"the op chose {chosen!r}, not {kernel!r}, the best this CPU has"
    env = {**os.environ, "HOOKSTATS_CPU_KERNEL": kernel}
    probe = "import hookstats, torch; hookstats.backend()  # loads the op\nprint(torch.ops.hookstats.cpu_kernel())"
    which = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    if which.stdout.strip() != kernel:
        return f"the {kernel} kernel was not chosen: {which.stdout.strip()!r} " + which.stderr[-2000:]
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", test_file, "-k", select],
                       env=env, capture_output=True, text=True, timeout=900)
    return None if r.returncode == 0 and " passed" in r.stdout else r.stdout[-3000:]


def on_thread_counts(fn, counts=(1, 2)):
    """fn() run under each torch thread count of counts (the count restored after): the list of its results."""
    before = torch.get_num_threads()
    try:
        out = []
        for n in counts:
            torch.set_num_threads(n)
            out.append(fn())
        return out
    finally:
        torch.set_num_threads(before)


class HostSyncError(AssertionError):
    pass


class _NoHostSync(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._local_scalar_dense.default:
            raise HostSyncError(f"host sync: {func} (what .item() calls)")
        if func in (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default):
            src = args[1] if func is torch.ops.aten.copy_.default else args[0]
            dst_dev = args[0].device if func is torch.ops.aten.copy_.default else kwargs.get("device")
            if isinstance(src, torch.Tensor) and src.device.type != "cpu" and dst_dev is not None \
                    and torch.device(dst_dev).type == "cpu":
                raise HostSyncError(f"device-to-host copy: {func}")
        self.ops.append(str(func))
        return func(*args, **kwargs)


@contextlib.contextmanager
def no_host_sync():
    """Fails the test if .item() or a device-to-host copy is dispatched inside. Yields the op names seen."""
    mode = _NoHostSync()
    mode.ops = []
    with mode:
        yield mode.ops


def exit_without_finalizing():
    """Ends a spawned distributed worker that finished its work (process group destroyed, results saved).
    In torch 2.13 a gloo process that ran FSDP2 aborts during interpreter finalization in about 1 run in 4,
    with or without hookstats ("terminate called without an active exception", after
    destroy_process_group); skipping finalization keeps that teardown bug out of the tests' verdicts."""
    os._exit(0)


def hist_step(k, every, hist_every):
    """The tests' own statement of the histogram cadence (docs/concepts.md): train step k counts the histograms
    when it is sampled (k % every == 0) and its index n = k / every is on the grid (n % hist_every == 0) or on the
    ramp below it (n = 1, 2, 4, 8, ... < hist_every). Pauses are the caller's to leave out."""
    n, rest = divmod(k, every)
    return rest == 0 and (n % hist_every == 0 or n in {2 ** j for j in range(63) if 2 ** j < hist_every})


def draw_nothing(monkeypatch):
    """Each chart a stub file where report would draw it: for the tests of what report reads, names and prints
    (test_cli.test_report_on_a_run_saved_with_and_without_linear_bins, the demo and the chart files' tests draw
    them)."""
    from pathlib import Path

    from hookstats.tools import flight_plots, lowprec_plots, plots
    for module, chart in ((plots, "plot_layer_stats"), (plots, "plot_layer_stats_overview"),
                          (plots, "plot_hist_heatmap"), (plots, "plot_hist_overview"), (plots, "plot_dynamic_range"),
                          (lowprec_plots, "plot_lowprec_grid"), (flight_plots, "plot_grad_norms"),
                          (flight_plots, "plot_flight")):
        monkeypatch.setattr(module, chart, lambda *a, **k: Path(k.get("path", a[-1])).write_bytes(b"png"))
