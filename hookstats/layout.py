"""The state layout of one target as constants: csrc/state_layout.def's rows, which rawstate.py reads and
csrc/accumulator.h compiles (tests/test_layout_source.py checks that the two agree, tests/test_layout.py every slot
against the compiled op). What each field is, how it merges and its empty value: hookstats/rawstate.py's table.

fstate float64[5]: n_finite, mean, M2, min, max (finite values only; min/max NaN while empty): rawstate's rows.
istate int64[istate_size(nbins, flags)]: only what the flags measure,
    count | near_zero | [under | nbins bins | over] (LINEAR_HIST) | NaN | +Inf | -Inf | [log2[256]] (LOG_HIST)
    | [float[FLOAT_SLOTS]] (FLOAT_HIST)
After the counters (count, near_zero: LIN_BASE of them) the slots are a window of the kernels' numbering (0 under,
1..nbins, nbins+1 over, nbins+2 NaN, nbins+3 +Inf, nbins+4 -Inf, nbins+5+k log2 slot k), starting at
kept_first(nbins, flags).
log2 slots: 0 exact zero | 1 nonzero below 2**-126 | 2 + k for |x| in [2**(k-126), 2**(k-125)).
Float buckets: slot = float32 bits >> 20 (what each slot holds: csrc/accumulator.h, float_slot).
"""

from .rawstate import (  # noqa: F401  (the slots of the fstate and the istate: rawstate.py owns them)
    FSTATE_SIZE, M2, MAX, MEAN, MIN, N_FINITE, COUNTERS, COUNT, NEAR_ZERO, LIN_BASE, LIN_EXTRA, LOG_SLOTS, LOG_EXP_MIN,
    MAX_BINS, LINEAR_HIST, LOG_HIST, SIGNED_NEAR_ZERO, FLOAT_HIST, HIST_FLAGS, SKIP_HIST, FLOAT_MANT_BITS, FLOAT_SHIFT,
    FLOAT_HALF, FLOAT_SLOTS, FLOAT_BELOW, FLOAT_ABOVE, FLOAT_ZERO, lin_slots, kept_first, nonfinite_base, log_base,
    float_base, istate_size)

def offsets(nbins, flags):
    """(kept_first, nonfinite_base, log_base, float_base, istate_size): what torch.ops.hookstats.istate_offsets
    gives from accumulator.h."""
    return (kept_first(nbins, flags), nonfinite_base(nbins, flags), log_base(nbins, flags), float_base(nbins, flags),
            istate_size(nbins, flags))



PARAM_FIELDS = ("lo", "inv_w", "eps", "nbins", "flags")


def op_params(lo, inv_w, eps, nbins, flags):
    """The op's scalars as its one params argument (float[] in the schema): a tuple of floats in PARAM_FIELDS'
    order. Every field fits a float64 exactly; the op (csrc/check_args.h OpParams::from) checks each one."""
    return (float(lo), float(inv_w), float(eps), float(nbins), float(flags))

