// accumulator.h -- THE statistics of hookstats: state layout, bin formulas and merges.
// Shared by the CPU kernel (g++), the CUDA kernel (nvcc) and the CUDA emulation tests; needs no ATen.
// Its layout constants are csrc/state_layout.def's rows, which hookstats/rawstate.py reads as well.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__) && !defined(HS_CPU_EMULATION)
#define HS_HD __host__ __device__ __forceinline__
#else
#define HS_HD inline
#endif

namespace hookstats {

// The layout's rows (slots, flags, sizes) are csrc/state_layout.def's, which hookstats/rawstate.py reads too.
#define HS_LAYOUT_VERSION(version) constexpr int kLayoutVersion = version;
#define HS_CONST(name, value) constexpr int k##name = value;
#include "state_layout.def"

// fstate: float64[kFState]. Moments are float64 and cover finite values only; min/max start as NaN
// ("empty") and are merged with IEEE minNum/maxNum, which ignore NaN.
enum FSlot : int {
#define HS_FSLOT(name, merge, step) k##name,
#include "state_layout.def"
  kFState
};

// istate: int64[istate_size(nbins, flags)] =
//   counters (count | near_zero) | [under | nbins bins | over] | NaN | +Inf | -Inf | [log2[kLogSlots]]
//   | [float[kFloatSlots]]
// Only what the flags measure is there: the linear bins with kLinearHist, the log2 slots with kLogHist, the float
// buckets with kFloatHist; the counters and the NaN/Inf counters always. After the counters the slots are a window of
// the numbering the kernels count in (lin_slot, then lin_slots(nbins) + log_slot): 0 under | 1..nbins | nbins+1 over
// | nbins+2 NaN | nbins+3 +Inf | nbins+4 -Inf | nbins+5+k log2 slot k; the window starts at kept_first (under, or NaN).
enum ISlot : int {
#define HS_COUNTER(name) k##name,
#include "state_layout.def"
  kLinBase
};

enum Flags : int {
#define HS_FLAG(name, bit) k##name = bit,
#include "state_layout.def"
};
constexpr int kHistFlags = kLinearHist | kLogHist | kFloatHist;
// The enabled flag's value (a 1-element tensor the op reads on x's device): 0 makes a call a no-op; any other value
// runs it; with bit kSkipHist set, the histograms (linear bins, log2 slots, float buckets) are not counted in this
// call (count, moments, min/max, the counters and NaN/Inf are). A bool True (1) counts everything.
// The flags of a call whose enabled flag has kSkipHist: no histogram counted (Params::layout keeps the state's).
HS_HD int call_flags(int flags, int enabled) { return (enabled & kSkipHist) ? flags & ~kHistFlags : flags; }

// Float buckets (kFloatHist; istate then ends with kFloatSlots more slots): log-linear buckets read from the
// value's float32 bits, (sign, exponent, top kFloatMantBits mantissa bits): slot = bits >> kFloatShift (20), so a
// bucket is at most 2^-3 of its lower edge wide and merging is adding counts. Slot s: sign s >> 11 (0 +, 1 -),
// k = s & 2047:
//   k in [0, 8):       |x| in [k * 2^-129, (k + 1) * 2^-129), nonzero (float32 subnormals, 8 linear sub-buckets)
//   k in [8, 2040):    |x| in [2^(e-127) * (1 + t/8), 2^(e-127) * (1 + (t+1)/8)), e = k >> 3 (1..254), t = k & 7
//   kFloatBelow:       float64 only: nonzero |x| < 2^-149 (below float32's smallest subnormal)
//   kFloatAbove:       float64 only: finite |x| >= 2^128 (beyond float32's exponents)
//   kFloatZero (k of the + half only): exact zeros, either sign
// NaN and +-Inf are not in the buckets (they have their own slots, nonfinite_base). float64 values are
// bucketed by their exact magnitude (truncated toward zero to float32, never rounded up across an edge), so
// the buckets of finite values sum to count - NaN - Inf, exactly, on every dtype.
constexpr int kFloatShift = 23 - kFloatMantBits;  // 20
constexpr int kFloatHalf = 1 << (31 - kFloatShift);  // 2048 slots per sign
constexpr int kFloatSlots = 2 * kFloatHalf;  // 4096
constexpr int kFloatBelow = kFloatHalf - 3;  // 2045 (+ half), 4093 (- half)
constexpr int kFloatAbove = kFloatHalf - 2;  // 2046, 4094
constexpr int kFloatZero = kFloatHalf - 1;   // 2047

// The kernels' linear numbering: under, nbins bins, over, NaN, +Inf, -Inf (lin_slot's range).
HS_HD int64_t lin_slots(int nbins) { return nbins + kLinExtra; }
// Where the istate's window of that numbering starts: at under with the linear bins, else at NaN.
HS_HD int64_t kept_first(int nbins, int flags) { return (flags & kLinearHist) ? 0 : nbins + 2; }
HS_HD int64_t nonfinite_base(int nbins, int flags) { return kLinBase + nbins + 2 - kept_first(nbins, flags); }
HS_HD int64_t log_base(int nbins, int flags) { return nonfinite_base(nbins, flags) + 3; }
HS_HD int64_t float_base(int nbins, int flags) { return log_base(nbins, flags) + ((flags & kLogHist) ? kLogSlots : 0); }
HS_HD int64_t istate_size(int nbins, int flags) {
  return float_base(nbins, flags) + ((flags & kFloatHist) ? kFloatSlots : 0);
}

// lo and inv_w = nbins / (hi - lo) are float32 values: every backend bins with the same fp32 ops.
struct Params {
  float lo, inv_w, eps;
  int nbins, flags;  // flags: what this call counts (call_flags)
  int layout;        // the flags the istate is laid out for: every offset into istate reads these
};

HS_HD uint32_t float_bits(float v) {
  uint32_t u;
  memcpy(&u, &v, sizeof(u));
  return u;
}
HS_HD bool is_finite(float v) { return (float_bits(v) & 0x7f800000u) != 0x7f800000u; }

// Linear slot of a finite value, relative to kLinBase: 0 underflow, 1..nbins, nbins+1 overflow.
// t = (v - lo) * inv_w is a subtraction then a multiplication, a shape no compiler fuses into an FMA,
// so gcc and nvcc round it identically. The clamps map NaN t (never produced for finite v) to -1 and
// keep the float->int conversion defined; floor is trunc corrected for negatives (exact either way).
HS_HD int lin_slot_finite(float v, float lo, float inv_w, int nbins) {
  float t = (v - lo) * inv_w;
  const float nbf = static_cast<float>(nbins);
  t = t > -1.0f ? t : -1.0f;
  t = t < nbf ? t : nbf;
  const int i = static_cast<int>(t);
  return 1 + i - (t < static_cast<float>(i) ? 1 : 0);
}
// Any value: non-finite values go to their own slots, so the linear slots always sum to count.
HS_HD int lin_slot(float v, float lo, float inv_w, int nbins) {
  if (is_finite(v)) return lin_slot_finite(v, lo, inv_w, nbins);
  if (v != v) return nbins + 2;
  return v > 0.0f ? nbins + 3 : nbins + 4;
}
// log2-magnitude slot of a finite float32 value: read straight from the exponent bits.
HS_HD int log_slot(float v) {
  const uint32_t u = float_bits(v) & 0x7fffffffu;
  const int e = static_cast<int>(u >> 23);
  return e == 0 ? (u != 0 ? 1 : 0) : e + 1;
}
// Float bucket of a finite float32 value (NaN/Inf never reach it): one shift, and zero moved to its own slot.
HS_HD int float_slot(float v) {
  const uint32_t u = float_bits(v);
  return (u & 0x7fffffffu) == 0 ? kFloatZero : static_cast<int>(u >> kFloatShift);
}
// Float bucket of a finite float64 value: its exact magnitude, outside float32's exponents in the end slots.
HS_HD int float_slot(double v) {
  const int half = v < 0 ? kFloatHalf : 0;
  const double a = v < 0 ? -v : v;
  if (a == 0.0) return kFloatZero;
  if (a >= 0x1p128) return half + kFloatAbove;
  if (a < 0x1p-149) return half + kFloatBelow;
  float f = static_cast<float>(a);
  if (static_cast<double>(f) > a) {  // rounded up: step back one float32 ulp (truncation toward zero)
    uint32_t u = float_bits(f) - 1;
    memcpy(&f, &u, sizeof(f));
  }
  return half + static_cast<int>(float_bits(f) >> kFloatShift);
}
// float64 inputs are binned after rounding to float32; keep tiny and huge finite values in range.
HS_HD float bin_value(double v) {
  const double a = v < 0 ? -v : v;
  if (a > 3.4028234663852886e38 && a <= 1.7976931348623157e308) return v < 0 ? -3.4028234663852886e38f : 3.4028234663852886e38f;
  const float f = static_cast<float>(v);
  if (f == 0.0f && v != 0.0) return v < 0 ? -1e-45f : 1e-45f;  // nonzero stays nonzero (slot 1)
  return f;
}
HS_HD float bin_value(float v) { return v; }

// The near-zero predicate of one value: v itself in the signed mode, else |v|, at or below eps. NaN is never near
// zero. Each loop's width has its own spelling of it in counter_predicates.h (the op counters' predicates).
HS_HD bool near_zero(float v, float eps, bool signed_mode) { return (signed_mode ? v : (v < 0 ? -v : v)) <= eps; }

// Chan et al.'s pairwise merge of (n, mean, M2); b is merged into a. Callers merge in a fixed order.
// Over float64's whole range: means near +-DBL_MAX of opposite signs overflow d (the mean is then taken as a
// weighted sum), and d * d may overflow where the cross term d^2 na nb / n still fits (it is then regrouped;
// na * f <= min(na, nb), so d * (d * na * f) overflows only where the term itself does). Both only on overflow,
// so ordinary merges round as ever. An M2 past DBL_MAX is +inf.
HS_HD void chan_merge(double& na, double& ma, double& m2a, double nb, double mb, double m2b) {
  if (nb == 0.0) return;
  if (na == 0.0) {
    na = nb; ma = mb; m2a = m2b;
    return;
  }
  const double n = na + nb, d = mb - ma, f = nb / n;
  double cross = d * d * na * f;
  if (d - d == 0.0) {
    ma += d * f;
    if (cross - cross != 0.0) cross = d * (d * (na * f));
  } else {
    ma = ma * (na / n) + mb * f;
  }
  m2a += m2b + cross;
  na = n;
}
// Shifted sums of n values: S1 = sum(v - K), S2 = sum((v - K)^2). The CUDA kernel merges threads, warps and blocks
// in this form (merge_sums: no division) and converts once (shifted_to_partial). Plain members: the kernel keeps
// them in __shared__ memory.
struct Sums {
  double n, K, s1, s2;
};
// About 1/n (n >= 1), good to ~2^-22: merge_sums' next shift needs no exact division (on the GPU one MUFU.RCP, where
// a float64 division is a reciprocal refined by a dozen instructions and a slow-path call).
HS_HD double approx_recip(double n) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(static_cast<float>(n)));
  return r;
#else
  return 1.0f / static_cast<float>(n);
#endif
}
// b merged into a, both re-shifted to K = a.K + approx_recip(n) * (merged S1 about a.K): K is the merged mean to
// ~2^-22 of its distance from a.K, so neither operand's re-shift adds terms much above the merged M2 (S2 about a
// shift d from the mean carries n d^2, and loses eps * n d^2 / M2 of M2 in the final conversion). Merging at a's
// shift instead would lose eps * n (a.K - mean)^2 / M2: a thread whose first chunk is an outlier sets it for the
// grid. Each operand's shift difference (K - a.K, K - b.K) is exact when K is within a factor 2 of its shift, and
// otherwise n d^2 dominates M2 and the rounding stays at eps of it. A merge that overflows (shifts or sums past
// DBL_MAX) leaves a non-finite K, S1 or S2, which stays so through later merges (the caller redoes with chan_merge).
HS_HD void merge_sums(Sums& a, const Sums& b) {
  if (b.n == 0.0) return;
  if (a.n == 0.0) {
    a = b;
    return;
  }
  const double n = a.n + b.n;
  const double K = a.K + (a.s1 + b.s1 + b.n * (b.K - a.K)) * approx_recip(n);
  const double da = K - a.K, db = K - b.K;
  a.s2 = (a.s2 + da * (a.n * da - 2.0 * a.s1)) + (b.s2 + db * (b.n * db - 2.0 * b.s1));
  a.s1 = (a.s1 - a.n * da) + (b.s1 - b.n * db);
  a.K = K;
  a.n = n;
}
HS_HD double fmin_nan(double a, double b) { return a < b || b != b ? a : b; }  // minNum: NaN = empty
HS_HD double fmax_nan(double a, double b) { return a > b || b != b ? a : b; }

// Moments of a partial (a chunk, a thread, a block) before merging into the state.
struct Partial {
  double n = 0, mean = 0, m2 = 0;
  double mn = __builtin_nan(""), mx = __builtin_nan("");
};
HS_HD void merge_partial(Partial& a, const Partial& b) {
  chan_merge(a.n, a.mean, a.m2, b.n, b.mean, b.m2);
  a.mn = fmin_nan(a.mn, b.mn);
  a.mx = fmax_nan(a.mx, b.mx);
}
// Shifted sums (n, S1 = sum(v-K), S2 = sum((v-K)^2)) -> (n, mean, M2); the cancellation happens in fp64.
HS_HD void shifted_to_partial(Partial& p, double n, double K, double s1, double s2) {
  p.n = n;
  if (n == 0.0) { p.mean = 0.0; p.m2 = 0.0; return; }
  const double off = s1 / n;
  p.mean = K + off;
  // s1 * (s1 / n) <= s2: no overflow while s2 is finite. An overflowed s2 leaves M2 inf or NaN (inf - inf),
  // which partial_overflowed() sees and the caller redoes: a NaN must never be clamped to 0 here.
  const double m2 = s2 - s1 * off;
  p.m2 = m2 < 0.0 ? 0.0 : m2;
}
// The redo of a block whose fp32 sums overflowed (|v - K| past ~1.8e19 squares past FLT_MAX; sums of
// values near FLT_MAX) or, on the GPU, underflowed (squares_underflowed below): the shifted sums of the
// finite values of v[0, n) in fp64, about the first of them. That shift needs no division (on the GPU an fp64 division is a call with a stack frame), and as
// M2 >= (K - mean)^2 the cancellation in shifted_to_partial is bounded by a factor of n. Rare: plain loops.
// scale (a power of two) multiplies every value first: the CUDA kernel's float64 threads that saw a huge value
// sum v * kHugeScale (exact but for values so tiny that they vanish beside the huge one anyway).
template <typename V>
HS_HD void fp64_shifted_sums(const V* v, int n, double& K, double& s1, double& s2, double scale = 1.0) {
  K = 0.0;
  for (int i = n - 1; i >= 0; --i) {
    const double x = static_cast<double>(v[i]) * scale;
    K = x - x == 0.0 ? x : K;
  }
  s1 = 0.0;
  s2 = 0.0;
  for (int i = 0; i < n; ++i) {
    const double x = static_cast<double>(v[i]) * scale;
    const double d = x - x == 0.0 ? x - K : 0.0;
    s1 += d;
    s2 += d * d;
  }
}
// 2^k for k in [-1022, 1023], exact (no libm: the header builds for host and device alike).
HS_HD double pow2(int k) {
  const uint64_t u = static_cast<uint64_t>(k + 1023) << 52;
  double d;
  memcpy(&d, &u, sizeof(d));
  return d;
}
// The redo of a float64 block whose fp64 sums overflowed (|v| past ~1.3e154 squares past DBL_MAX; sums of values
// near DBL_MAX): the moments of its finite values on v * 2^-k, k = max(0, e - 500) for the largest magnitude 2^e,
// so every scaled |v - K| < 2^502 and the sums of squares stay finite; mean and M2 are scaled back exactly (M2 is
// inf only where it passes DBL_MAX itself). For k = 0 (every float32/16 block) it is fp64_shifted_sums' result.
template <typename V>
HS_HD void fp64_scaled_partial(const V* v, int n, Partial& p) {
  double big = 0.0, cnt = 0.0;
  for (int i = 0; i < n; ++i) {
    const double x = static_cast<double>(v[i]);
    const double a = x < 0 ? -x : x;
    if (x - x == 0.0) {
      big = a > big ? a : big;
      cnt += 1.0;
    }
  }
  uint64_t bits;
  memcpy(&bits, &big, sizeof(bits));
  const int e = static_cast<int>((bits >> 52) & 0x7ff) - 1023;
  const int k = e > 500 ? e - 500 : 0;
  const double down = pow2(-k), up = pow2(k);
  double K = 0.0, s1 = 0.0, s2 = 0.0;
  for (int i = n - 1; i >= 0; --i) {
    const double x = static_cast<double>(v[i]);
    K = x - x == 0.0 ? x * down : K;
  }
  for (int i = 0; i < n; ++i) {
    const double x = static_cast<double>(v[i]);
    const double d = x - x == 0.0 ? x * down - K : 0.0;
    s1 += d;
    s2 += d * d;
  }
  p.n = cnt;
  if (cnt == 0.0) { p.mean = 0.0; p.m2 = 0.0; return; }
  const double off = s1 / cnt;
  p.mean = (K + off) * up;
  const double m2 = s2 - s1 * off;
  p.m2 = (m2 > 0.0 ? m2 : 0.0) * up * up;
}
// The CUDA kernel's float64 threads: values below kHuge keep every shifted sum of a thread (|v - K| < 2^481,
// squares < 2^962, < 2^40 of them) finite. A thread that sees a finite |v| >= kHuge sums every value times
// kHugeScale from then on (|v| * 2^-600 < 2^424: finite sums again) and scales its mean and M2 back at its end.
constexpr double kHuge = 0x1p480;
constexpr double kHugeScale = 0x1p-600;
constexpr double kHugeUnscale = 0x1p600;
HS_HD bool partial_overflowed(const Partial& p) { return !(p.mean - p.mean == 0.0 && p.m2 - p.m2 == 0.0); }
// The other end: fp32 squares of |v - K| below ~1e-19 (FLT_MIN = 2^-126) are subnormal or zero, so tiny
// values (vanishing gradients) lost most of their variance. A block whose fp32 sum of squares is below 2^-100
// is redone: above it, the subnormal rounding of a block's <= 1024 squares (<= 2^-150 each) is below 2^-40 of
// the sum. A block of equal values (ReLU zeros) is skipped: its fp32 sums are exact, and a redo would be waste.
template <typename F>
HS_HD bool squares_underflowed(F sum_sq, bool values_differ) {
  return sum_sq < static_cast<F>(0x1p-100) && values_differ;
}
// The CPU kernels redo such a block in fp32 (vectorised) with v - K times 2^100, exact: a nonzero |v - K| is
// >= 2^-149, so its scaled square is >= 2^-98, a normal fp32; below the threshold every |v - K| < 2^-50, so
// the scaled squares stay below 2^100. The CUDA kernel calls fp64_shifted_sums out of line instead.
constexpr float kTinyScale = 0x1p100f;
constexpr double kTinyUnscale = 0x1p-100;

HS_HD void merge_into_state(double* fs, const Partial& p) {
  chan_merge(fs[kNFinite], fs[kMean], fs[kM2], p.n, p.mean, p.m2);
  fs[kMin] = fmin_nan(fs[kMin], p.mn);
  fs[kMax] = fmax_nan(fs[kMax], p.mx);
}

}  // namespace hookstats
