"""How long the fused op takes per call, for plan(): on CUDA from the figures an H200 measured for the kernel
at fb1651a (benchmarks/results/gpu_h200.json; the kernel's changes since are not measured on a GPU yet; the H100 table of the kernel before the float buckets is kept beside it), on CPU
from the op timed on the spot (a few sizes per dtype, this machine, this torch thread count)."""
import bisect
import math
import statistics
import time

import torch

from .. import accumulate, layout
from ..state import scratch_bytes

MB = 1 << 20

# H100 80GB HBM3, torch 2.11, eager calls, cold L2 (benchmarks/results/gpu_bandwidth_h100.json):
# tensor MB -> op GB/s with both histograms / with neither.
H100_GBPS = {
    torch.float32: {"both": {1: 90, 4: 251, 16: 732, 64: 1328, 256: 1786, 1024: 1997},
                    "none": {1: 97, 4: 270, 16: 807, 64: 1772, 256: 2526, 1024: 2858}},
    torch.bfloat16: {"both": {1: 55, 4: 235, 16: 564, 64: 887, 256: 1055, 1024: 1116},
                     "none": {1: 59, 4: 265, 16: 720, 64: 1324, 256: 1718, 1024: 1881}},
}
# fp16 runs the bf16 code path (the same SASS count per element); fp64 was not measured: the fp32 rate in
# values per second scaled by the instructions per element of the two kernels (44.8 vs 101.5).
H100_SAME_AS = {torch.float16: (torch.bfloat16, 1.0), torch.float64: (torch.float32, 2.0 * 44.8 / 101.5)}
H100_EAGER_CALL_S = 10.24e-6  # eager call of the op on a 4 KB fp32 tensor: the floor of one call
H100_SOURCE = ("H100 80GB HBM3, benchmarks/results/gpu_bandwidth_h100.json (eager calls, cold L2; fp16 as bf16, "
               "fp64 estimated from fp32; under CUDA graphs the per-call floor is ~5.7 us instead of ~10 us)")


# H200, the kernel at fb1651a, calls in CUDA graphs (benchmarks/results/gpu_h200.json, N(0,1)): tensor MB -> op GB/s
# on a step that counts the float buckets, on one that skips them (hist_every), and with every histogram (64 linear
# bins, log2 slots, float buckets); the per-call floor from the 4 KB and 1 MB calls.
H200_GBPS = {
    torch.bfloat16: {"buckets": {256: 2131.3, 1024: 2366.5}, "skip": {256: 2801.1, 1024: 3239.4},
                     "all": {256: 1630.8, 1024: 1782.4}},
    torch.float32: {"buckets": {256: 3295.4, 1024: 3836.4}, "skip": {256: 3457.5, 1024: 4098.8},
                    "all": {256: 2708.6, 1024: 3111.7}},
}
H200_CALL_S = {4096: 7.30e-6, MB: 11.03e-6}  # a 4 KB and a 1 MB bf16 call in a CUDA graph
H200_SOURCE = ("H200, the kernel at fb1651a, benchmarks/results/gpu_h200.json (calls in CUDA graphs; histogram steps averaged with the "
               "skip steps of hist_every; fp16 as bf16, fp64 estimated from fp32)")


def _interp_log(table, mb):
    """GB/s at `mb` megabytes: linear in log2(size) between the measured sizes, flat beyond them."""
    sizes = sorted(table)
    if mb <= sizes[0]:
        return table[sizes[0]]
    if mb >= sizes[-1]:
        return table[sizes[-1]]
    i = bisect.bisect_right(sizes, mb)
    a, b = sizes[i - 1], sizes[i]
    f = (math.log2(mb) - math.log2(a)) / (math.log2(b) - math.log2(a))
    return table[a] + f * (table[b] - table[a])


class H100Speed:
    """Seconds per call of the CUDA kernel on an H100, from the measured table."""
    source = H100_SOURCE

    def __init__(self, histograms=True):
        self.column = "both" if histograms else "none"

    def seconds(self, dtype, numel):
        base, scale = H100_SAME_AS.get(dtype, (dtype, 1.0))
        itemsize = torch.empty((), dtype=base).element_size()
        nbytes = numel * itemsize
        mb = nbytes / MB
        if mb < 1:  # launch-bound: from the 4 KB floor to the 1 MB figure
            at_1mb = MB / (H100_GBPS[base][self.column][1] * 1e9)
            return (H100_EAGER_CALL_S + (at_1mb - H100_EAGER_CALL_S) * mb) / scale
        return nbytes / (_interp_log(H100_GBPS[base][self.column], mb) * 1e9) / scale


class H200Speed:
    """Seconds per call of the CUDA kernel on an H200, from the measured figures: up to 1 MB the floor of a call,
    linear in the size between the 4 KB and 1 MB calls; above it the 1 MB call plus the rest at the large-tensor
    rate. With histograms and hist_every=N, the mean over the cadence: (one counting step + N - 1 skipping) / N."""
    source = H200_SOURCE

    def __init__(self, cfg):
        flags = cfg.flags  # what the op counts (a log2 histogram can be derived from the float buckets)
        self.column = ("all" if flags & (layout.LINEAR_HIST | layout.LOG_HIST) else
                       "buckets" if flags & layout.FLOAT_HIST else "skip")
        self.every = cfg.hist_every if cfg.flags & layout.HIST_FLAGS else 1

    def _one(self, base, column, nbytes):
        small, big = H200_CALL_S[4096], H200_CALL_S[MB]
        if nbytes <= MB:
            return small + (big - small) * max(0, nbytes - 4096) / (MB - 4096)
        return big + (nbytes - MB) / (_interp_log(H200_GBPS[base][column], nbytes / MB) * 1e9)

    def seconds(self, dtype, numel):
        base, scale = H100_SAME_AS.get(dtype, (dtype, 1.0))
        nbytes = numel * torch.empty((), dtype=base).element_size()
        hist = self._one(base, self.column, nbytes)
        skip = self._one(base, "skip", nbytes)
        return (hist + (self.every - 1) * skip) / self.every / scale


class MeasuredSpeed:
    """Seconds per call measured on this machine: the real op with the monitor's configuration timed on tensors
    of a few sizes per dtype (the median of `repeats` timed loops each), linear in the size between them, the
    smallest size's time below it and the largest size's rate per value above it. Each call of a loop reads
    the next slice of a buffer of `pool` values, so that tensors above the caches' size are read from memory,
    as in a training step, where the activations of a layer are long out of cache when their gradient comes:
    timing one tensor again and again read it from cache and predicted the benchmark transformer's op time 25%
    low. The H100 table is "cold" for the same reason. With histograms and hist_every=N > 1 a train step's call
    counts them on one measured step in N: the figure is the mean over the cadence, (with + (N - 1) * without) / N,
    both timed (the op with its device flag at 1 and at 1 | SKIP_HIST)."""

    SIZES = (256, 1 << 12, 1 << 16, 1 << 20, 1 << 23)

    def __init__(self, cfg, device="cpu", sizes=SIZES, repeats=5, pool=1 << 24, clock=time.perf_counter):
        self.cfg, self.device, self.sizes = cfg, torch.device(device), tuple(sorted(sizes))
        self.repeats, self.pool, self.clock = repeats, max(pool, max(sizes)), clock
        self.points = {}  # dtype -> [seconds per call at each of self.sizes]
        self.source = (f"the op measured on this machine ({self.device}, {torch.get_num_threads()} torch thread(s), "
                       f"{accumulate.backend()} backend)")

    def time_calls(self, buf, n, mode=1):
        """Seconds per call on slices of n values of buf, the op's device flag at `mode` (1: everything,
        1 | layout.SKIP_HIST: no histograms)."""
        fstate = torch.zeros(5, dtype=torch.float64, device=self.device)
        istate = torch.zeros(self.cfg.istate_size, dtype=torch.int64, device=self.device)
        scratch = torch.zeros(scratch_bytes(self.device), dtype=torch.uint8, device=self.device)
        flag = torch.tensor([mode], dtype=torch.uint8, device=self.device)
        args = (fstate, istate, scratch, flag, self.cfg.op_params())
        xs = list(buf[: buf.numel() // n * n].view(-1, n).unbind(0))
        calls = max(2, min(200, (1 << 22) // n))
        accumulate.accumulate_(xs[-1], *args)  # warm-up
        times = []
        for r in range(self.repeats):
            self._sync()
            t0 = self.clock()
            for i in range(calls):
                accumulate.accumulate_(xs[(r * calls + i) % len(xs)], *args)
            self._sync()
            times.append((self.clock() - t0) / calls)
        return statistics.median(times)

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def measure(self, dtype):
        if dtype not in self.points:
            buf = torch.randn(self.pool, generator=torch.Generator().manual_seed(0)).to(dtype=dtype, device=self.device)
            points = [self.time_calls(buf, n) for n in self.sizes]
            every = self.cfg.hist_every
            if every > 1 and self.cfg.flags & layout.HIST_FLAGS:
                without = [self.time_calls(buf, n, 1 | layout.SKIP_HIST) for n in self.sizes]
                points = [(t + (every - 1) * u) / every for t, u in zip(points, without)]
            self.points[dtype] = points
        return self.points[dtype]

    def seconds(self, dtype, numel):
        t, n = self.measure(dtype), self.sizes
        if numel <= n[0]:
            return t[0]
        if numel >= n[-1]:
            return t[-1] * numel / n[-1]
        i = bisect.bisect_right(n, numel)
        return t[i - 1] + (t[i] - t[i - 1]) * (numel - n[i - 1]) / (n[i] - n[i - 1])


def speed_for(device, cfg, **measure_kwargs):
    """The op-time model plan() uses for tensors on `device`: the H100 table for CUDA, the op measured now
    on CPU, None elsewhere (no figure)."""
    device = torch.device(device)
    if device.type == "cuda":
        return H200Speed(cfg)
    if device.type == "cpu":
        return MeasuredSpeed(cfg, device, **measure_kwargs)
    return None
