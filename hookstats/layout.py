"""The state layout of one target, mirroring csrc/accumulator.h (tests/test_layout.py checks every slot against the
compiled op). What each field is, how it merges and its empty value: hookstats/rawstate.py's table.

fstate float64[5]: n_finite, mean, M2, min, max (finite values only; min/max NaN while empty): rawstate's rows.
istate int64[istate_size(nbins, flags)]: only what the flags measure,
    count | near_zero | [under | nbins bins | over] (LINEAR_HIST) | NaN | +Inf | -Inf | [log2[256]] (LOG_HIST)
    | [float[FLOAT_SLOTS]] (FLOAT_HIST)
After near_zero the slots are a window of the kernels' numbering (0 under, 1..nbins, nbins+1 over, nbins+2 NaN,
nbins+3 +Inf, nbins+4 -Inf, nbins+5+k log2 slot k), starting at kept_first(nbins, flags).
log2 slots: 0 exact zero | 1 nonzero below 2**-126 | 2 + k for |x| in [2**(k-126), 2**(k-125)).
Float buckets: slot = float32 bits >> 20 (what each slot holds: csrc/accumulator.h, float_slot).
"""
import numpy as np

from .rawstate import FSTATE_SIZE, M2, MAX, MEAN, MIN, N_FINITE  # noqa: F401  (the fstate slots)

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
    """The kernels' linear numbering: under, nbins bins, over, NaN, +Inf, -Inf."""
    return nbins + LIN_EXTRA


def kept_first(nbins, flags):
    """Where the istate's window of the kernels' numbering starts: at under with the linear bins, else at NaN."""
    return 0 if flags & LINEAR_HIST else nbins + 2


def nonfinite_base(nbins, flags):
    """istate index of the NaN counter (+Inf, -Inf follow)."""
    return LIN_BASE + nbins + 2 - kept_first(nbins, flags)


def log_base(nbins, flags):
    return nonfinite_base(nbins, flags) + 3


def float_base(nbins, flags):
    return log_base(nbins, flags) + (LOG_SLOTS if flags & LOG_HIST else 0)


def istate_size(nbins, flags):
    return float_base(nbins, flags) + (FLOAT_SLOTS if flags & FLOAT_HIST else 0)


def offsets(nbins, flags):
    """(kept_first, nonfinite_base, log_base, float_base, istate_size): what torch.ops.hookstats.istate_offsets
    gives from accumulator.h."""
    return (kept_first(nbins, flags), nonfinite_base(nbins, flags), log_base(nbins, flags), float_base(nbins, flags),
            istate_size(nbins, flags))


def log2_edges():
    """Lower edges of the log2 slots 1..255 (slot 0 is exact zero): 0, then 2**-126 .. 2**127."""
    return np.concatenate([[0.0], np.exp2(np.arange(LOG_EXP_MIN, LOG_EXP_MIN + LOG_SLOTS - 1, dtype=np.float64))])


PARAM_FIELDS = ("lo", "inv_w", "eps", "nbins", "flags")


def op_params(lo, inv_w, eps, nbins, flags):
    """The op's scalars as its one params argument (float[] in the schema): a tuple of floats in PARAM_FIELDS'
    order. Every field fits a float64 exactly; the op (csrc/check_args.h OpParams::from) checks each one."""
    return (float(lo), float(inv_w), float(eps), float(nbins), float(flags))

