"""Low-precision what-if: the share of a target's finite values (zeros included) that a cast to fp8 e4m3, fp8 e5m2,
fp16 or bf16 would lose, under three scaling recipes, derived on the host from the float buckets.

A cast multiplies x by a scale s and rounds x * s to the format, to nearest, ties to even. Of the finite values:
- underflow: x != 0 whose rounded x * s is zero or subnormal (flushed, or left with fewer significant bits):
  |x * s| < U = min_normal * (1 - 2**-(mantissa_bits + 1)), the midpoint below the smallest normal (a tie there
  rounds up to the normal, whose mantissa is even);
- overflow: x whose x * s rounds above the largest finite value M (a saturating cast clips it to M, an IEEE cast
  gives Inf, e4m3fn NaN): |x * s| >= O = M + ulp(M) / 2, strictly above O for e4m3 (M = 448 has an even mantissa,
  so the tie 464 rounds down to it).

Recipes (TransformerEngine's, transformer_engine/pytorch/fp8.py _default_sf_compute; recipe.DelayedScaling):
- none: s = 1;
- current: s = M / amax, amax the largest |x| of the record's own values (per-tensor current scaling);
- delayed: s = (M / amax_h) / 2**margin, amax_h the largest of the amaxes of the amax_history_len steps before the
  record's step (amax_compute_algo "max": the step's own amax is not in it). Where amax_h is 0, NaN or missing
  (no step before) the scale is 1, TransformerEngine's starting scale (it keeps its previous scale there).
fp16 and bf16 take the same formulas with their own M (a loss-scale-like per-tensor scale).

The counts come from buckets.abs_below: exact where the threshold U / s or O / s is a bucket edge (with s = 1:
e4m3 and e5m2 underflow, e5m2 overflow), otherwise within the count of the one bucket holding the threshold.
Values exactly at a threshold that is not an edge are where the bucket estimate and the cast may differ.
"""
import math

import numpy as np

from . import buckets, layout

BF16_MAX = float.fromhex("0x1.fep127")
# name: (mantissa bits, smallest normal, largest finite value M)
FORMATS = {"e4m3": (3, 2.0 ** -6, 448.0), "e5m2": (2, 2.0 ** -14, 57344.0), "fp16": (10, 2.0 ** -14, 65504.0),
           "bf16": (7, 2.0 ** -126, BF16_MAX)}
RECIPES = ("", "_current", "_delayed")  # no scaling, current, delayed: the suffix of each field's name
SIDES = ("underflow", "overflow")
DEFAULT_AMAX_HISTORY_LEN = 1024  # TransformerEngine's DelayedScaling defaults
DEFAULT_MARGIN = 0


def thresholds(fmt):
    """(U, O, overflow includes O) of format `fmt` (module docstring)."""
    mant, normal, top = FORMATS[fmt]
    ulp = 2.0 ** (math.floor(math.log2(top)) - mant)
    return normal * (1 - 2.0 ** -(mant + 1)), top + ulp / 2, fmt != "e4m3"


def field_names(recipes=RECIPES):
    """The what-if fields of `recipes` (suffixes of RECIPES), e.g. e4m3_underflow, e4m3_overflow_current,
    bf16_underflow_delayed."""
    return tuple(f"{fmt}_{side}{recipe}" for recipe in recipes for fmt in FORMATS for side in SIDES)


def te_scale(amax, fmt, margin=DEFAULT_MARGIN):
    """TransformerEngine's scale (M / amax) / 2**margin per element of amax; 1 where amax is not > 0 or not
    finite."""
    amax = np.asarray(amax, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = (FORMATS[fmt][2] / amax) / 2.0 ** margin
    return np.where((amax > 0) & np.isfinite(amax), s, 1.0)


def scales_for(amax, margin=DEFAULT_MARGIN):
    """{fmt: te_scale(amax, fmt, margin)} for every format."""
    return {fmt: te_scale(amax, fmt, margin) for fmt in FORMATS}


def shares(counts, scales=None, maximum=None, *, recipe=""):
    """{f"{fmt}_{side}{recipe}": share [...]} for every format, of the finite values counts holds (NaN where it
    holds none). scales: {fmt: s [...]} (scales_for), or None: s = 1; maximum [...]: a known bound on |x| (NaN:
    none) that narrows the top bucket."""
    return shares_of(counts, {recipe: scales}, maximum)


def shares_of(counts, scales_by_recipe, maximum=None):
    """shares() of several recipes at once, {recipe: scales or None}: one pass over the buckets for all of them
    (a stats() or flush of thousands of targets derives them all)."""
    p = buckets.prepare(counts)
    c, lead = p.c, p.lead
    rows = c.shape[0]
    n = c.sum(axis=1).astype(np.float64)
    zeros = (c[:, layout.FLOAT_ZERO] + c[:, layout.FLOAT_HALF + layout.FLOAT_ZERO]).astype(np.float64)
    limits = np.array([thresholds(fmt)[:2] for fmt in FORMATS])  # [formats, 2]: U, O
    ts = []
    for recipe, scales in scales_by_recipe.items():
        s = np.ones((rows, len(FORMATS))) if scales is None else np.stack(
            [np.broadcast_to(np.asarray(scales[fmt], np.float64), lead).reshape(-1) for fmt in FORMATS], axis=-1)
        ts.append(limits[None] / s[..., None])  # [rows, formats, 2]
    t = np.concatenate(ts, axis=1).reshape(lead + (len(ts) * len(FORMATS) * 2,))
    below = buckets.abs_below(p, t, maximum=maximum).reshape(rows, len(ts), len(FORMATS), 2)
    with np.errstate(invalid="ignore", divide="ignore"):
        lost = np.stack([below[..., 0] - zeros[:, None, None], n[:, None, None] - below[..., 1]], axis=-1)
        lost = np.where(n[:, None, None, None] > 0, lost / n[:, None, None, None], np.nan)
    out = {}
    for r, recipe in enumerate(scales_by_recipe):
        for k, fmt in enumerate(FORMATS):
            for side_i, side in enumerate(SIDES):
                out[f"{fmt}_{side}{recipe}"] = lost[:, r, k, side_i].reshape(lead)
    return out
