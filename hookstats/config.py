"""StatsConfig: what every target measures (histogram range, near-zero rule), validated up front."""
import dataclasses
import math

import numpy as np

from . import layout


@dataclasses.dataclass(frozen=True)
class StatsConfig:
    """Linear bins are half-open [lo + i*w, lo + (i+1)*w), w = (hi - lo) / nbins; values below lo count
    as underflow and values >= hi as overflow. The range is fixed up front: inferring it from the data
    would need a host sync. near_zero="abs" counts |x| <= eps; "le" counts x <= eps (fastai's rule)."""

    nbins: int = 40
    lo: float = -10.0
    hi: float = 10.0
    eps: float = 1e-6
    near_zero: str = "abs"
    linear_hist: bool = True
    log_hist: bool = True

    def __post_init__(self):
        if isinstance(self.nbins, bool) or not isinstance(self.nbins, int) or not 1 <= self.nbins <= layout.MAX_BINS:
            raise ValueError(f"nbins must be an int in [1, {layout.MAX_BINS}], got {self.nbins!r}")
        for name in ("lo", "hi", "eps"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                raise ValueError(f"{name} must be a finite number, got {v!r}")
        if not self.lo < self.hi:
            raise ValueError(f"lo must be < hi, got lo={self.lo} hi={self.hi}")
        if not math.isfinite(self.nbins / (self.hi - self.lo)) or self.inv_w <= 0:
            raise ValueError(f"the bin width (hi - lo) / nbins is not representable in float32: lo={self.lo} hi={self.hi}")
        if self.eps < 0:
            raise ValueError(f"eps must be >= 0, got {self.eps}")
        if self.near_zero not in ("abs", "le"):
            raise ValueError(f"near_zero must be 'abs' (|x| <= eps) or 'le' (x <= eps), got {self.near_zero!r}")

    # The kernels bin in float32: these are the exact float32 values every backend uses.
    @property
    def lo32(self):
        return float(np.float32(self.lo))

    @property
    def inv_w(self):
        return float(np.float32(self.nbins / (self.hi - self.lo)))

    @property
    def eps32(self):
        return float(np.float32(self.eps))

    @property
    def flags(self):
        return ((layout.LINEAR_HIST if self.linear_hist else 0) | (layout.LOG_HIST if self.log_hist else 0)
                | (layout.SIGNED_NEAR_ZERO if self.near_zero == "le" else 0))

    @property
    def istate_size(self):
        return layout.istate_size(self.nbins)

    def edges(self):
        """The nbins + 1 edges of the linear bins (as the kernel sees them: float32 lo and inv_w)."""
        return self.lo32 + np.arange(self.nbins + 1, dtype=np.float64) / self.inv_w

    def op_args(self):
        return (self.lo32, self.inv_w, self.eps32, self.nbins, self.flags)
