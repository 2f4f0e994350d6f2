"""The two methods of tests/float_oracle.py check each other: each value's float bucket from its bits and from its
exact magnitude (np.frexp) agree on every dtype, over float32's whole bit space sampled, every binade edge
from float64's subnormals to its max, float32's subnormals, zeros of both signs, NaN and Inf; and both give
the slots of values worked out by hand."""
import numpy as np
import pytest
import torch
from float_oracle import (ABOVE, BELOW, HALF, NONFINITE, SLOTS, ZERO, float_buckets, float_counts, slots_from_bits,
                          slots_from_frexp)

from hookstats import layout

# the slots float32 values reach: k < 2040 of each sign (exponent 255 is Inf/NaN), one zero, and -1 (NaN, Inf);
# float64 adds BELOW and ABOVE of each sign
FINITE_F32 = set(range(2040)) | set(range(HALF, HALF + 2040)) | {ZERO, NONFINITE}


def edges_f64():
    """Every power of two float64 has (its subnormals included) with its neighbours, random values in every
    binade, zeros of both signs, NaN and +-Inf, each value with both signs."""
    rng = np.random.default_rng(0)
    p = np.ldexp(1.0, np.arange(-1074, 1024))
    near = np.concatenate([p, np.nextafter(p, 0), np.nextafter(p, np.inf), p * 1.125, p * 1.875,
                           np.nextafter(p * 1.125, 0)])
    spread = np.ldexp(rng.uniform(0.5, 1.0, 200_000), rng.integers(-1074, 1025, 200_000))
    bits = rng.integers(0, 2**63, 200_000, dtype=np.uint64).view(np.float64)  # any bit pattern: NaNs too
    special = np.array([0.0, np.nan, np.inf, 5e-324, 2.0 ** -149, 2.0 ** -126, 2.0 ** 128,
                        float(np.finfo(np.float32).max), 2.0 ** -149 * (1 - 2.0 ** -53)])
    with np.errstate(over="ignore", invalid="ignore"):
        v = np.concatenate([near, spread, bits, special])
    return np.concatenate([v, -v])


def test_constants_are_the_layouts():
    assert (HALF, SLOTS, BELOW, ABOVE, ZERO) == (layout.FLOAT_HALF, layout.FLOAT_SLOTS, layout.FLOAT_BELOW,
                                                 layout.FLOAT_ABOVE, layout.FLOAT_ZERO)


def test_the_methods_agree_on_float64_beyond_float32s_range():
    v = edges_f64()
    bits, frexp = slots_from_bits(v), slots_from_frexp(v)
    bad = np.flatnonzero(bits != frexp)
    assert bad.size == 0, [(float(v[i]), int(bits[i]), int(frexp[i])) for i in bad[:5]]
    assert set(bits.tolist()) == FINITE_F32 | {BELOW, ABOVE, BELOW + HALF, ABOVE + HALF}


def test_the_methods_agree_on_float32s_bit_space():
    rng = np.random.default_rng(1)
    f = np.concatenate([rng.integers(0, 2**32, 2_000_000, dtype=np.uint64).astype(np.uint32),
                        np.arange(0, 2**16, dtype=np.uint32),  # the low subnormals one by one
                        np.arange(0, 2**32, 2**12 + 1, dtype=np.uint64).astype(np.uint32)]).view(np.float32)
    bits, frexp = slots_from_bits(f), slots_from_frexp(f)
    bad = np.flatnonzero(bits != frexp)
    assert bad.size == 0, [(float(f[i]), int(bits[i]), int(frexp[i])) for i in bad[:5]]
    assert set(bits.tolist()) == FINITE_F32


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_the_methods_agree_on_tensors_of_every_dtype(dtype):
    width = torch.finfo(dtype).bits
    raw = torch.arange(0, 2**16, dtype=torch.int32) if width == 16 else \
        torch.randint(-2**31, 2**31 - 1, (1 << 20,), dtype=torch.int64, generator=torch.Generator().manual_seed(2))
    x = raw.to(torch.int16).view(dtype) if width == 16 else raw.to(torch.int32).view(torch.float32).to(dtype)
    np.testing.assert_array_equal(slots_from_bits(x), slots_from_frexp(x))
    np.testing.assert_array_equal(float_counts(x), float_buckets(x))
    assert float_counts(x).sum() == torch.isfinite(x).sum().item()


def test_both_give_the_slots_worked_out_by_hand():
    # 1.0: biased exponent 127, mantissa 0 -> 8 * 127; 1.75 = 1.11b: top 3 bits 110 -> + 6; 2**-149: float32's
    # smallest subnormal -> 0; 2**-127 * 1.5 = 6 * 2**-129 -> 6; 2**-126 -> 8; float32's max -> 8 * 254 + 7
    want = {1.0: 1016, 1.75: 1022, -1.0: 1016 + HALF, 2.0 ** -149: 0, 1.5 * 2.0 ** -127: 6, 2.0 ** -126: 8,
            float(np.finfo(np.float32).max): 2039, 0.0: ZERO, -0.0: ZERO, float("nan"): NONFINITE,
            float("-inf"): NONFINITE}
    beyond = {2.0 ** 128: ABOVE, -1e300: ABOVE + HALF, 1e-300: BELOW, -5e-324: BELOW + HALF, 2.0 ** -150: BELOW}
    for values, dtypes in ((want, (np.float32, np.float64)), (beyond, (np.float64,))):
        for dt in dtypes:
            v = np.array(list(values), dtype=dt)
            for method in (slots_from_bits, slots_from_frexp):
                assert method(v).tolist() == list(values.values()), (method.__name__, dt)
