"""The state layout of one target, mirroring csrc/accumulator.h (tests check that they agree).

fstate float64[5]: n_finite, mean, M2, min, max (finite values only; min/max NaN while empty).
istate int64[2 + nbins + 5 + 256]:
    count | near_zero | linear[under | nbins bins | over | NaN | +Inf | -Inf] | log2[256]
log2 slots: 0 exact zero | 1 nonzero below 2**-126 | 2 + k for |x| in [2**(k-126), 2**(k-125)).
With FLOAT_HIST, istate ends with FLOAT_SLOTS float buckets (slot = float32 bits >> 20; what each slot holds:
csrc/accumulator.h, float_slot).
"""
import numpy as np

N_FINITE, MEAN, M2, MIN, MAX = range(5)
FSTATE_SIZE = 5
COUNT, NEAR_ZERO, LIN_BASE = 0, 1, 2
LIN_EXTRA = 5
LOG_SLOTS = 256
LOG_EXP_MIN = -126
MAX_BINS = 256

LINEAR_HIST, LOG_HIST, SIGNED_NEAR_ZERO, FLOAT_HIST = 1, 2, 4, 8
HIST_FLAGS = LINEAR_HIST | LOG_HIST | FLOAT_HIST
# the enabled flag's values: 0 off, 1 everything, 1 | SKIP_HIST (3) all but the histograms (accumulator.h kSkipHist)
SKIP_HIST = 2

FLOAT_MANT_BITS = 3
FLOAT_SHIFT = 23 - FLOAT_MANT_BITS
FLOAT_HALF = 1 << (31 - FLOAT_SHIFT)  # slots per sign: + half first, then - half
FLOAT_SLOTS = 2 * FLOAT_HALF
FLOAT_BELOW, FLOAT_ABOVE, FLOAT_ZERO = FLOAT_HALF - 3, FLOAT_HALF - 2, FLOAT_HALF - 1


def lin_slots(nbins):
    return nbins + LIN_EXTRA


def log_base(nbins):
    return LIN_BASE + lin_slots(nbins)


def float_base(nbins):
    return log_base(nbins) + LOG_SLOTS


def istate_size(nbins, flags=0):
    return float_base(nbins) + (FLOAT_SLOTS if flags & FLOAT_HIST else 0)


def nan_slot(nbins):
    return LIN_BASE + nbins + 2


def log2_edges():
    """Lower edges of the log2 slots 1..255 (slot 0 is exact zero): 0, then 2**-126 .. 2**127."""
    return np.concatenate([[0.0], np.exp2(np.arange(LOG_EXP_MIN, LOG_EXP_MIN + LOG_SLOTS - 1, dtype=np.float64))])
