"""Independent NumPy oracle of the float buckets (csrc/accumulator.h float_slot, hookstats/layout.py FLOAT_*):
each value's slot from its float32 bits, float64 values from their exact magnitude (np.frexp). Shared by every
test of the buckets; it imports nothing of hookstats on purpose."""
import numpy as np

HALF = 2048  # slots per sign: + half 0..2047, - half 2048..4095
SLOTS = 2 * HALF
BELOW, ABOVE, ZERO = 2045, 2046, 2047  # float64 below 2**-149, float64 >= 2**128, exact zero (either sign)
NONFINITE = -1


def _as_numpy(x):
    """NumPy float16/32/64 array of x; a torch tensor keeps float64 and goes through float32 otherwise (exact
    for float16 and bfloat16)."""
    if hasattr(x, "detach"):
        t = x.detach().cpu()
        return t.numpy() if str(t.dtype) == "torch.float64" else t.float().numpy()
    return np.asarray(x)


def _slots_f32(f):
    bits = f.astype(np.float32).view(np.uint32)
    mag = bits & np.uint32(0x7FFFFFFF)
    slot = (mag >> np.uint32(20)).astype(np.int64) + np.where(bits >> np.uint32(31), HALF, 0)
    slot = np.where(mag == 0, ZERO, slot)
    return np.where(mag >= np.uint32(0x7F800000), NONFINITE, slot)


def _slots_f64(d):
    a = np.abs(d)
    m, e = np.frexp(a)  # a = m * 2**e, m in [0.5, 1): biased float32 exponent e + 126
    with np.errstate(invalid="ignore", over="ignore"):
        normal = (e + 126) * 8 + np.floor((2 * m - 1) * 8).astype(np.int64)
        sub = np.floor(a * 2.0 ** 129).astype(np.int64)  # a in [2**-149, 2**-126): eighths of 2**-126
    slot = np.where(a >= 2.0 ** -126, normal, sub)
    slot = np.where(a < 2.0 ** -149, BELOW, slot)
    slot = np.where(a >= 2.0 ** 128, ABOVE, slot)
    slot = slot + np.where(np.signbit(d), HALF, 0)
    slot = np.where(a == 0, ZERO, slot)
    return np.where(np.isfinite(d), slot, NONFINITE)


def float_slots(x):
    """The slot of every value of x, flattened; NaN and +-Inf get -1 (they are not in the buckets)."""
    v = _as_numpy(x).reshape(-1)
    return _slots_f64(v) if v.dtype == np.float64 else _slots_f32(v)


def float_counts(x):
    """int64[4096] bucket counts of x's finite values, as the op's FLOAT_HIST slots hold them."""
    s = float_slots(x)
    return np.bincount(s[s >= 0], minlength=SLOTS).astype(np.int64)
