"""The tests' NumPy emulation of a cast to a low-precision float format, in float64, independent of hookstats: round
to nearest, ties to even, with the format's mantissa bits and smallest normal exponent and no largest exponent (a
value above the largest finite one keeps its rounded magnitude, so overflow is seen whatever the cast does there)."""
import numpy as np

# name: (mantissa bits, smallest normal, largest finite value)
FORMATS = {"e4m3": (3, 2.0 ** -6, 448.0), "e5m2": (2, 2.0 ** -14, 57344.0), "fp16": (10, 2.0 ** -14, 65504.0),
           "bf16": (7, 2.0 ** -126, float.fromhex("0x1.fep127"))}


def rounded(y, fmt):
    """|y| rounded to format `fmt` (float64; y finite)."""
    mant, normal, _ = FORMATS[fmt]
    a = np.abs(np.asarray(y, dtype=np.float64))
    _, e = np.frexp(np.where(a > 0, a, 1.0))  # a = f * 2**e, f in [0.5, 1): floor(log2 a) = e - 1
    ulp = np.ldexp(1.0, np.maximum(e - 1, int(np.log2(normal))) - mant)
    return np.rint(a / ulp) * ulp


def lost(x, scale, fmt):
    """(underflow, overflow) masks of the finite values x scaled by `scale` and cast to `fmt`: underflow, x != 0
    rounding to zero or to a subnormal; overflow, rounding above the largest finite value."""
    _, normal, top = FORMATS[fmt]
    q = rounded(np.asarray(x, dtype=np.float64) * scale, fmt)
    return (x != 0) & (q < normal), q > top


def te_scale(amax, fmt, margin=0):
    """TransformerEngine's delayed-scaling scale (fp8_max / amax) / 2**margin, 1 where amax is not > 0 and finite."""
    top = FORMATS[fmt][2]
    return (top / amax) / 2.0 ** margin if amax > 0 and np.isfinite(amax) else 1.0
