"""The tests' independent NumPy oracle of the float buckets (csrc/accumulator.h float_slot, hookstats/layout.py
FLOAT_*), by two methods written apart that check each other (tests/test_float_oracle.py): from the bits
(float32 bits for 32-bit and narrower inputs, float64 bits for float64) and from the exact magnitude
(np.frexp in float64). Shared by every test of the buckets; it imports nothing of hookstats on purpose."""
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


# ---- method 1: from the bits ----
def _slots_f32_bits(f):
    bits = f.astype(np.float32).view(np.uint32)
    mag = bits & np.uint32(0x7FFFFFFF)
    slot = (mag >> np.uint32(20)).astype(np.int64) + np.where(bits >> np.uint32(31), HALF, 0)
    slot = np.where(mag == 0, ZERO, slot)
    return np.where(mag >= np.uint32(0x7F800000), NONFINITE, slot)


def _slots_f64_bits(d):
    """From float64 bits: 1.m * 2**e; float32's normal range keeps e and m's top 3 bits; below it, |x| // 2**-129
    is the 53-bit significand shifted right."""
    bits = np.ascontiguousarray(d, dtype=np.float64).view(np.uint64)
    biased = ((bits >> np.uint64(52)) & np.uint64(0x7FF)).astype(np.int64)
    mant = bits & np.uint64((1 << 52) - 1)
    e = biased - 1023
    normal = (e + 127) * 8 + (mant >> np.uint64(49)).astype(np.int64)
    shift = np.clip(-77 - e, 0, 63).astype(np.uint64)  # |x| * 2**129 = (2**52 + m) * 2**(e + 77)
    sub = ((mant | np.uint64(1 << 52)) >> shift).astype(np.int64)
    slot = np.where(e >= -126, normal, sub)
    slot = np.where(e < -149, BELOW, np.where(e >= 128, ABOVE, slot))  # e < -149 takes float64's subnormals too
    slot = slot + np.where(bits >> np.uint64(63), HALF, 0)
    slot = np.where((biased == 0) & (mant == 0), ZERO, slot)
    return np.where(biased == 0x7FF, NONFINITE, slot)


def slots_from_bits(x):
    """The slot of every value of x, flattened, from its bits; NaN and +-Inf get -1 (not in the buckets)."""
    v = _as_numpy(x).reshape(-1)
    return _slots_f64_bits(v) if v.dtype == np.float64 else _slots_f32_bits(v)


# ---- method 2: from the exact magnitude ----
def slots_from_frexp(x):
    """The slot of every value of x, flattened, from its float64 magnitude by np.frexp, not its bits:
    k = 8 * biased exponent + top 3 mantissa bits; below 2**-126, k = |x| // 2**-129; float64 beyond float32:
    BELOW / ABOVE; exact zeros (either sign) ZERO; minus half + 2048; NaN and +-Inf -1."""
    with np.errstate(invalid="ignore"):  # a signalling NaN's payload
        v = _as_numpy(x).astype(np.float64).reshape(-1)
    a = np.abs(v)
    with np.errstate(invalid="ignore"):
        m, e = np.frexp(np.where(np.isfinite(a), a, 0.0))  # a = m * 2**e, m in [0.5, 1): a in [2**(e-1), 2**e)
        normal = 8 * (e - 1 + 127) + np.floor((2 * m - 1) * 8)
        k = np.where(a < 2.0 ** -126, np.floor(np.minimum(a, 1.0) * 2.0 ** 129), normal)
    k = np.where(a >= 2.0 ** 128, ABOVE, np.where(a < 2.0 ** -149, BELOW, k))
    k = np.where(a == 0, ZERO, k + np.where(v < 0, HALF, 0)).astype(np.int64)
    return np.where(np.isfinite(v), k, NONFINITE)


def _counts(slots):
    return np.bincount(slots[slots >= 0], minlength=SLOTS).astype(np.int64)


float_slots = slots_from_bits  # the tests' default


def float_counts(x):
    """int64[4096] bucket counts of x's finite values, as the op's FLOAT_HIST slots hold them (from the bits)."""
    return _counts(slots_from_bits(x))


def float_buckets(x):
    """The same counts from the exact magnitudes (slots_from_frexp): the other method, for the op's tests."""
    return _counts(slots_from_frexp(x))
