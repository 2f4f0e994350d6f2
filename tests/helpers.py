"""Test helpers shared by the test files: a float64 NumPy oracle of the op and a no-host-sync guard."""
import contextlib
import os
import subprocess
import sys

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hookstats import layout

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
    """Statistics of tensor x computed independently in NumPy float64: returns (fstate, istate) arrays."""
    dtype = x.dtype
    v = x.detach().double().reshape(-1).numpy()
    nb = cfg.nbins
    fin = np.isfinite(v)
    vf = v[fin]
    f = np.array([0.0, 0.0, 0.0, np.nan, np.nan])
    if vf.size:
        mean = vf.mean()
        f = np.array([vf.size, mean, ((vf - mean) ** 2).sum(), vf.min(), vf.max()])
    i = np.zeros(layout.istate_size(nb), dtype=np.int64)
    i[layout.COUNT] = v.size
    b = bin_values(v, dtype)
    with np.errstate(invalid="ignore"):
        a = b if cfg.near_zero == "le" else np.abs(b)
        i[layout.NEAR_ZERO] = int((a <= np.float32(cfg.eps)).sum())
    lin = np.zeros(layout.lin_slots(nb), dtype=np.int64)
    lin[nb + 2] = np.isnan(v).sum()
    lin[nb + 3] = np.isposinf(v).sum()
    lin[nb + 4] = np.isneginf(v).sum()
    if cfg.linear_hist:
        t = (b[fin] - np.float32(cfg.lo32)) * np.float32(cfg.inv_w)  # float32 arithmetic, as the kernels
        slots = np.floor(np.clip(t, -1, nb)).astype(np.int64) + 1
        lin += np.bincount(slots, minlength=layout.lin_slots(nb))
    i[layout.LIN_BASE: layout.LIN_BASE + layout.lin_slots(nb)] = lin
    if cfg.log_hist and not cfg.float_hist:  # with float buckets the op leaves its log2 slots empty
        bf = np.abs(b[fin]).astype(np.float64)
        _, e = np.frexp(bf)  # |x| in [2**(e-1), 2**e)
        slots = np.where(bf == 0, 0, np.where(bf < 2.0 ** -126, 1, e - 1 - layout.LOG_EXP_MIN + 2))
        i[layout.log_base(nb):] = np.bincount(slots, minlength=layout.LOG_SLOTS)
    if cfg.float_hist:
        i = np.concatenate([i, float_buckets(x)])
    return f, i


def without_histograms(istate, cfg):
    """An oracle istate (oracle()) as a call whose enabled flag has SKIP_HIST leaves it: count, near-zero and the
    NaN/Inf slots; no linear bins (under, bins, over), log2 slots or float buckets."""
    i = np.zeros_like(istate)
    nan = layout.nan_slot(cfg.nbins)
    i[[layout.COUNT, layout.NEAR_ZERO]] = istate[[layout.COUNT, layout.NEAR_ZERO]]
    i[nan: nan + 3] = istate[nan: nan + 3]
    return i


def float_buckets(x):
    """Float bucket counts (csrc/accumulator.h float_slot) of tensor x, from each finite value's exact magnitude
    by np.frexp, not its bits: k = 8 * biased exponent + top 3 mantissa bits; below 2**-126, k = |x| // 2**-129;
    float64 beyond float32: FLOAT_BELOW / FLOAT_ABOVE; exact zeros (either sign) FLOAT_ZERO; minus half + 2048."""
    v = x.detach().double().reshape(-1).numpy()
    v = v[np.isfinite(v)]
    a = np.abs(v)
    m, e = np.frexp(a)  # a = m * 2**e, m in [0.5, 1): a in [2**(e-1), 2**e)
    normal = 8 * (e - 1 + 127) + np.floor((2 * m - 1) * 8)
    k = np.where(a < 2.0 ** -126, np.floor(np.minimum(a, 1.0) * 2.0 ** 129), normal)
    k = np.where(a >= 2.0 ** 128, layout.FLOAT_ABOVE, np.where(a < 2.0 ** -149, layout.FLOAT_BELOW, k))
    k = np.where(a == 0, layout.FLOAT_ZERO, k + np.where(v < 0, layout.FLOAT_HALF, 0)).astype(np.int64)
    return np.bincount(k, minlength=layout.FLOAT_SLOTS)


def rerun_with_portable_kernel(test_file, select):
    """The tests of test_file matching `-k select`, in a process where HOOKSTATS_CPU_KERNEL=portable forces the
    kernel CPUs without AVX2/FMA/F16C run. Returns a failure message, or None when they passed."""
    env = {**os.environ, "HOOKSTATS_CPU_KERNEL": "portable"}
    which = subprocess.run([sys.executable, "-c", "import hookstats, torch; print(torch.ops.hookstats.cpu_kernel())"],
                           env=env, capture_output=True, text=True, timeout=120)
    if which.stdout.strip() != "portable":
        return "the portable kernel was not chosen: " + which.stderr[-2000:]
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
