"""StatsConfig: what every target measures (histogram range, near-zero rule, histogram cadence), validated up front.
The argument checks it uses: checks.py; attach()'s keywords: options.py."""
import dataclasses
import math

import numpy as np

from . import layout
from .checks import check_arg, check_count  # noqa: F401 (hookstats.config's names)


@dataclasses.dataclass(frozen=True)
class StatsConfig:
    """Linear bins are half-open [lo + i*w, lo + (i+1)*w), w = (hi - lo) / nbins; values below lo count
    as underflow and values >= hi as overflow. The range is fixed up front: inferring it from the data
    would need a host sync. near_zero="abs" counts `|x|` <= eps; "le" counts x <= eps (fastai's rule).

    Defaults: the range-free float buckets (float_hist) on, the linear histogram off. It is on with
    linear_hist=True or when any of nbins/lo/hi is given (a range asked for is never silently dropped);
    None fields are resolved here, so repr and == show what is measured. With float_hist the kernel skips
    its own log2 slots: log_hist then means "records carry log2_hist, summed from the buckets".

    hist_every=N: on train-phase steps the histograms (float buckets, linear bins, log2 slots) are counted on one
    sampled step in N, the steps k with k % (every * N) == 0 (step 0 always), and before the second of them the
    steps every * (1, 2, 4, 8, ...) (clock.is_hist_step: a short run is not described by step 0 alone); count,
    moments, min/max, near-zero and NaN/Inf on every sampled step. Eval forwards (eval=True) count them always.
    Whatever is derived from the histograms is normalised by the values they hold (records' hist_count), never by
    count."""

    nbins: int = None
    lo: float = None
    hi: float = None
    eps: float = 1e-6
    near_zero: str = "abs"
    linear_hist: bool = None
    log_hist: bool = True
    float_hist: bool = True
    hist_every: int = None
    # the delayed-scaling what-if (hookstats/whatif.py): TransformerEngine's DelayedScaling amax_history_len, margin
    amax_history_len: int = 1024
    amax_margin: int = 0

    def __post_init__(self):
        if self.linear_hist is None:
            object.__setattr__(self, "linear_hist", any(v is not None for v in (self.nbins, self.lo, self.hi)))
        for name, default in {**LINEAR_DEFAULTS, "hist_every": HIST_EVERY}.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, default)
        object.__setattr__(self, "hist_every", check_count("hist_every", self.hist_every))
        checks = {"nbins": (int, 1, layout.MAX_BINS), "lo": (float,), "hi": (float,), "eps": (float, 0),
                  "near_zero": (("abs", "le"),), "linear_hist": (bool,), "log_hist": (bool,),
                  "float_hist": (bool,), "amax_history_len": (int, 1), "amax_margin": (int, 0)}
        for name, rule in checks.items():  # frozen: the checked (Python) values replace NumPy scalars
            object.__setattr__(self, name, check_arg(name, getattr(self, name), *rule))
        if self.linear_hist is False:
            # a range asked for is never silently dropped; the defaults count as not given (dataclasses.replace)
            asked = {k: v for k, v in (("nbins", self.nbins), ("lo", self.lo), ("hi", self.hi))
                     if v != LINEAR_DEFAULTS[k]}
            if asked:
                raise ValueError(f"linear_hist=False contradicts {', '.join(f'{k}={v!r}' for k, v in asked.items())}: "
                                 "nbins, lo and hi set the linear histogram; drop them, or drop linear_hist=False")
        if not self.lo < self.hi:
            raise ValueError(f"lo must be < hi, got lo={self.lo} hi={self.hi}")
        if not self.lo32 < float(np.float32(self.hi)):
            raise ValueError(f"lo and hi must differ in float32 (the kernels' bin arithmetic), got lo={self.lo} hi={self.hi}")
        if not math.isfinite(self.inv_w):
            raise ValueError(f"the bins are too narrow for float32: nbins / (hi - lo) = {self.nbins / (self.hi - self.lo):g} "
                             f"overflows (lo={self.lo} hi={self.hi} nbins={self.nbins})")
        if self.eps > 0 and self.eps32 == 0:
            raise ValueError(f"eps={self.eps!r} rounds to 0 in float32 (the kernels compare in float32): use 0 "
                             "(exact zeros) or a value >= 1.4e-45")

    # The kernels bin in float32: these are the exact float32 values every backend uses.
    @property
    def lo32(self):
        return float(np.float32(self.lo))

    @property
    def inv_w(self):
        with np.errstate(over="ignore"):  # too narrow a bin: inf, which __post_init__ rejects
            return float(np.float32(self.nbins / (self.hi - self.lo)))

    @property
    def eps32(self):
        return float(np.float32(self.eps))

    @property
    def flags(self):
        log_slots = self.log_hist and not self.float_hist  # with buckets, log2_hist is summed from them
        return ((layout.LINEAR_HIST if self.linear_hist else 0) | (layout.LOG_HIST if log_slots else 0)
                | (layout.SIGNED_NEAR_ZERO if self.near_zero == "le" else 0) | (layout.FLOAT_HIST if self.float_hist else 0))

    @property
    def istate_size(self):
        return layout.istate_size(self.nbins, self.flags)

    def edges(self):
        """The nbins + 1 edges of the linear bins (as the kernel sees them: float32 lo and inv_w)."""
        return self.lo32 + np.arange(self.nbins + 1, dtype=np.float64) / self.inv_w

    def op_params(self):
        """The op's params argument for this configuration (built once, then kept)."""
        p = self.__dict__.get("_op_params")
        if p is None:
            p = layout.op_params(self.lo32, self.inv_w, self.eps32, self.nbins, self.flags)
            object.__setattr__(self, "_op_params", p)  # a cache, not a field: equality and replace() ignore it
        return p


LINEAR_DEFAULTS = {"nbins": 40, "lo": -10.0, "hi": 10.0}  # the linear bins when asked for without a range
# Train steps between histogram steps by default: measured (benchmarks/hist_cadence.py, docs/performance.md); it divides
# history's log_every=10, so every flush window holds the same number of histogram steps.
HIST_EVERY = 10


def hist_every_for(window, every=1):
    """The default hist_every under logging windows of `window` steps (history's log_every, a Trainer's logging
    interval) with every=N: HIST_EVERY, or fewer so that every * hist_every <= window, whence every window of
    `window` consecutive steps holds a histogram step (a multiple of every * hist_every): none is left without
    the figures of the histograms."""
    return max(1, min(HIST_EVERY, int(window) // max(1, int(every))))
