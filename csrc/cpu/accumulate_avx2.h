// accumulate_avx2.h -- the AVX2 chunk kernel of the CPU op for float32, float16 (F16C) and bfloat16 inputs.
// Same results as the portable ChunkKernel of accumulate_cpu_kernel.h: slots from the accumulator.h formulas (no FMA
// in the bin formula), fp32 sums over <= 8 values per lane then fp64, one fp32 shift K per block; without the
// linear/log2 histograms one pass per block (run_one_pass, shared with accumulate_avx512.h), else two.
#pragma once
#include <immintrin.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "../accumulator.h"
#include "../counter_predicates.h"

// Everything below, lambdas included, is compiled for AVX2; accumulate_cpu_kernel.h calls it only where the CPU has it.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,popcnt")

namespace hookstats {

// Counters of the float buckets: 16 bits, so the copies of the 4096 buckets take 32 KB (the caller flushes them
// before one can wrap).
using FloatCount = uint16_t;

namespace avx2 {

constexpr int kVec = 8;
constexpr int kBlock = 1024;      // values per shift K and per moment merge: amortises the fp64 merge
constexpr int kSmallBlock = 256;  // the chunk's end, before the portable kernel takes the last < 256
constexpr int kPrefetchBytes = 4096;

template <typename T>
inline __m256 load8(const T* x) {
  if constexpr (std::is_same_v<T, float>) {
    return _mm256_loadu_ps(x);
  } else if constexpr (std::is_same_v<T, c10::Half>) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
  } else {
    static_assert(std::is_same_v<T, c10::BFloat16>);
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
}

inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}
inline double hsum(__m256d v) {
  const __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}
inline int64_t hsum(__m256i v) {
  alignas(32) int32_t a[kVec];
  _mm256_store_si256(reinterpret_cast<__m256i*>(a), v);
  int64_t s = 0;
  for (int j = 0; j < kVec; ++j) s += a[j];
  return s;
}
inline float hmin(__m256 v) {
  alignas(32) float a[kVec];
  _mm256_store_ps(a, v);
  float m = a[0];
  for (int j = 1; j < kVec; ++j) m = a[j] < m ? a[j] : m;
  return m;
}
inline float hmax(__m256 v) {
  alignas(32) float a[kVec];
  _mm256_store_ps(a, v);
  float m = a[0];
  for (int j = 1; j < kVec; ++j) m = a[j] > m ? a[j] : m;
  return m;
}

// accumulator.h float_slot, 8 or 16 values at a time, stored with their copy's offset (value i counts into copy
// i % kSub): bits >> 20, zeros of either sign to kFloatZero (the caller moves non-finite values to the dummy slot).
template <int kSub>
struct FloatSlots {
  static_assert(kSub == 2 || kSub == 4 || kSub == 8, "the copies of a float bucket are side by side");
  __m256i zero_i = _mm256_setzero_si256(), float_zero = _mm256_set1_epi32(kFloatZero), off, off16;
  __m256i abs16 = _mm256_set1_epi16(0x7fff), float_zero16 = _mm256_set1_epi16(kFloatZero);
  FloatSlots() {
    alignas(32) int32_t o[kVec];
    alignas(32) int16_t o16[2 * kVec];
    for (int k = 0; k < 2 * kVec; ++k) {
      if (k < kVec) o[k] = k % kSub;
      o16[k] = static_cast<int16_t>(k % kSub);
    }
    off = _mm256_load_si256(reinterpret_cast<const __m256i*>(o));
    off16 = _mm256_load_si256(reinterpret_cast<const __m256i*>(o16));
  }
  // v and |v| as float32
  void f32(__m256 v, __m256 av, uint32_t* out) const {
    const __m256i zero = _mm256_cmpeq_epi32(_mm256_castps_si256(av), zero_i);
    const __m256i f = _mm256_blendv_epi8(_mm256_srli_epi32(_mm256_castps_si256(v), kFloatShift), float_zero, zero);
    _mm256_store_si256(reinterpret_cast<__m256i*>(out), _mm256_add_epi32(_mm256_slli_epi32(f, __builtin_ctz(kSub)), off));
  }
  // 16 bfloat16 values, float32's top half: bits16 >> 4
  void bf16(const c10::BFloat16* x, uint16_t* out) const {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
    const __m256i zero = _mm256_cmpeq_epi16(_mm256_and_si256(w, abs16), zero_i);
    const __m256i f = _mm256_blendv_epi8(_mm256_srli_epi16(w, kFloatShift - 16), float_zero16, zero);
    _mm256_store_si256(reinterpret_cast<__m256i*>(out), _mm256_add_epi16(_mm256_slli_epi16(f, __builtin_ctz(kSub)), off16));
  }
};

// Pass 2 of a block: (sum (v - K), sum (v - K)^2) over vals[0, 8 * vecs) in fp64, fp32 over 8 values per lane
// first; (v - K) times kTinyScale when kScaled, masked to the finite values unless all_finite. extra(j, v) runs
// beside vector j (the histograms' increments, min/max): the stores and the FP units then work side by side.
template <bool kScaled, typename Extra>
inline void shifted_sums(const float* vals, int vecs, float K, bool all_finite, double& s1, double& s2, Extra&& extra) {
  const __m256 kv = _mm256_set1_ps(K), scale = _mm256_set1_ps(kTinyScale), inf = _mm256_set1_ps(__builtin_inff());
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256d s1a = _mm256_setzero_pd(), s1b = s1a, s2a = s1a, s2b = s1a;
  auto pass2 = [&](int j, __m256& c1, __m256& c2) {
    const __m256 v = _mm256_loadu_ps(vals + j * kVec);
    extra(j, v);
    __m256 d = _mm256_sub_ps(v, kv);
    if constexpr (kScaled) d = _mm256_mul_ps(d, scale);
    if (!all_finite) d = _mm256_and_ps(d, _mm256_cmp_ps(_mm256_and_ps(v, abs_mask), inf, _CMP_LT_OQ));
    c1 = _mm256_add_ps(c1, d);
    c2 = _mm256_fmadd_ps(d, d, c2);
  };
  for (int g = 0; g < vecs; g += 8) {
    __m256 c1a = _mm256_setzero_ps(), c1b = c1a, c2a = c1a, c2b = c1a;
    for (int j = g; j < g + 8; j += 2) {
      pass2(j, c1a, c2a);
      pass2(j + 1, c1b, c2b);
    }
    const __m256 c1 = _mm256_add_ps(c1a, c1b), c2 = _mm256_add_ps(c2a, c2b);  // 8 values per lane
    s1a = _mm256_add_pd(s1a, _mm256_cvtps_pd(_mm256_castps256_ps128(c1)));
    s1b = _mm256_add_pd(s1b, _mm256_cvtps_pd(_mm256_extractf128_ps(c1, 1)));
    s2a = _mm256_add_pd(s2a, _mm256_cvtps_pd(_mm256_castps256_ps128(c2)));
    s2b = _mm256_add_pd(s2b, _mm256_cvtps_pd(_mm256_extractf128_ps(c2, 1)));
  }
  s1 = hsum(_mm256_add_pd(s1a, s1b));
  s2 = hsum(_mm256_add_pd(s2a, s2b));
}

// The moments of a block of ct finite values (of n) from its shifted sums about K, redone scaled where the fp32
// squares underflowed and in fp64 where they overflowed (accumulator.h).
inline Partial block_partial(const float* vals, int n, int ct, float K, double s1, double s2, bool values_differ) {
  if (squares_underflowed(s2, values_differ)) {
    shifted_sums<true>(vals, n / kVec, K, ct == n, s1, s2, [](int, __m256) {});
    s1 *= kTinyUnscale;
    s2 *= kTinyUnscale * kTinyUnscale;
  }
  Partial bp;
  shifted_to_partial(bp, static_cast<double>(ct), K, s1, s2);
  if (partial_overflowed(bp)) {
    double Kd, d1, d2;
    fp64_shifted_sums(vals, n, Kd, d1, d2);
    shifted_to_partial(bp, static_cast<double>(ct), Kd, d1, d2);
  }
  return bp;
}

// s + the 8 fp32 lanes of c in fp64, 4 lanes each
inline __m256d add_halves(__m256d s, __m256 c) {
  return _mm256_add_pd(s, _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(c)), _mm256_cvtps_pd(_mm256_extractf128_ps(c, 1))));
}

// The moments, min and max of the finite values of a block of n values (a multiple of 64), two passes: its fp32
// mean as the shift K, then the shifted sums. Where they are not float32, the values are left in buf.
template <typename T>
Partial exact_block(const T* x, int n, float* buf, __m256& bmn, __m256& bmx) {
  const __m256 inf = _mm256_set1_ps(__builtin_inff()), ninf = _mm256_set1_ps(-__builtin_inff());
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 sum = _mm256_setzero_ps();
  __m256i cnt = _mm256_setzero_si256();
  bmn = inf;
  bmx = ninf;
  for (int j = 0; j < n / kVec; ++j) {
    const __m256 v = load8(x + j * kVec);
    if constexpr (!std::is_same_v<T, float>) _mm256_store_ps(buf + j * kVec, v);
    const __m256 fin = _mm256_cmp_ps(_mm256_and_ps(v, abs_mask), inf, _CMP_LT_OQ);
    sum = _mm256_add_ps(sum, _mm256_and_ps(v, fin));
    cnt = _mm256_sub_epi32(cnt, _mm256_castps_si256(fin));
    bmn = _mm256_min_ps(bmn, _mm256_blendv_ps(inf, v, fin));
    bmx = _mm256_max_ps(bmx, _mm256_blendv_ps(ninf, v, fin));
  }
  const float* vals = std::is_same_v<T, float> ? reinterpret_cast<const float*>(x) : buf;
  const int ct = static_cast<int>(hsum(cnt));
  if (ct == 0) return Partial();
  const float K = hsum(sum) / static_cast<float>(ct);
  double s1, s2;
  shifted_sums<false>(vals, n / kVec, K, ct == n, s1, s2, [](int, __m256) {});
  return block_partial(vals, n, ct, K, s1, s2, hmax(bmx) > hmin(bmn));
}

// The op without the linear and log2 histograms (its defaults) reads each block ONCE, in the AVX2 or AVX-512
// kernel: the shift K is the previous block's mean (the first block's: the mean of its first 64 values), accepted
// when the block's shifted sums show it close to the block's own mean, (S1/n)^2 <= S2/n / 16, so that S2 - S1^2/n
// loses at most 1/16 of S2 (M2's rounding error grows by <= 7%). A block holding a NaN or Inf (its sums are not
// finite), whose squares overflowed or underflowed, or whose K was too far, is redone by exact_block, in two passes
// as run_blocks does. The float buckets of a block are counted during the next one's pass, from slots stored long
// before. OnePass holds what the two kernels share: the slots, K, the redone blocks' min/max and each block's end.
template <typename T, bool kFloat, int kSub, typename Slot>
struct OnePass {
  // Padded: slots read at i while slots are stored at i in the other buffer, 4 KB apart, would look like
  // reads of the fresh stores to the core (4K aliasing; measured: fp32 0.40 -> 1.25 ns/value).
  alignas(64) Slot fsb[2][kBlock + 64];
  alignas(64) float buf[kBlock];
  FloatCount* fh;
  int cur = 0, prev_n = 0;  // prev_n: values of the previous block, whose slots are counted during this one
  float K = 0.0f, rmn = __builtin_inff(), rmx = -__builtin_inff();  // rmn, rmx: of the redone blocks

  OnePass(const T* x, int64_t n, FloatCount* h) : fh(h) {
    if (n < kSmallBlock) return;
    __m256 s = _mm256_setzero_ps();
    for (int j = 0; j < 8; ++j) s = _mm256_add_ps(s, load8(x + j * kVec));
    K = hsum(s) / 64.0f;
    K = K - K == 0.0f ? K : 0.0f;
  }
  // The block's pass copies these into locals: through the members, each increment would reload them.
  struct Counter {
    FloatCount* fh;
    const Slot* prev;
    int prev_n;
    template <int kN>
    void count(int i) const {  // the previous block's values [i, i + kN)
      if (!kFloat || i >= prev_n) return;
      const Slot* f = prev + i;
#pragma GCC unroll 16
      for (int k = 0; k < kN; ++k) ++fh[f[k]];
    }
    void count_from(int i) const {
      for (; i < prev_n; i += kVec) count<kVec>(i);
    }
  };
  Slot* slots() { return fsb[cur]; }
  Counter counter() const { return {fh, fsb[cur ^ 1], prev_n}; }
  // The end of block x[0, kB) after its pass: its moments from the shifted sums s1, s2 about K where K was near,
  // else from exact_block (its min/max then into rmn, rmx; non-finite values to the dummy slot and nonfin).
  // all_k(): whether every value of the block is K (asked only when the squares are tiny). Returns whether the
  // pass's sums were kept (else its min/max, which may be +-Inf, are not the block's).
  template <typename AllK>
  bool end_block(const T* x, int kB, double s1, double s2, AllK&& all_k, Partial& res, int64_t* nonfin) {
    const bool finite = s1 - s1 == 0.0 && s2 - s2 == 0.0;
    bool near = finite && s1 * s1 <= s2 * (kB / 16.0);
    if (near && s2 < 0x1p-100) near = all_k();
    if (!near && finite && s2 >= 0x1p-100) near = reshift(x, kB, s1, s2);
    Partial bp;
    if (near) {
      shifted_to_partial(bp, kB, K, s1, s2);
    } else {
      __m256 bmn, bmx;
      bp = exact_block(x, kB, buf, bmn, bmx);
      rmn = std::min(rmn, hmin(bmn));
      rmx = std::max(rmx, hmax(bmx));
      const float* vals = std::is_same_v<T, float> ? reinterpret_cast<const float*>(x) : buf;
      for (int i = 0; i < kB && bp.n < kB; ++i) {
        const float v = vals[i];
        if (is_finite(v)) continue;
        ++nonfin[v != v ? 0 : (v > 0 ? 1 : 2)];
        if (kFloat) fsb[cur][i] = static_cast<Slot>(kFloatSlots * kSub + i % kSub);  // the dummy slot
      }
    }
    if (bp.n > 0) {
      chan_merge(res.n, res.mean, res.m2, bp.n, bp.mean, bp.m2);
      const float next = static_cast<float>(bp.mean);
      K = next - next == 0.0f ? next : 0.0f;
    }
    prev_n = kB;
    cur ^= 1;
    return near;
  }
  // A block of finite values whose K was too far (NCHW data: the previous block held other channels, with other
  // means): its shifted sums again, about its own mean K + s1 / kB, in one more pass over the block, which is in L1
  // now (exact_block would take two, and the min/max again). Returns whether that K is near (then in K, s1, s2).
  bool reshift(const T* x, int kB, double& s1, double& s2) {
    const float K2 = static_cast<float>(K + s1 / kB);
    if (K2 - K2 != 0.0f) return false;
    const float* vals = reinterpret_cast<const float*>(x);
    if constexpr (!std::is_same_v<T, float>) {
      for (int j = 0; j < kB / kVec; ++j) _mm256_store_ps(buf + j * kVec, load8(x + j * kVec));
      vals = buf;
    }
    double t1, t2;
    shifted_sums<false>(vals, kB / kVec, K2, true, t1, t2, [](int, __m256) {});
    if (!(t1 - t1 == 0.0 && t2 - t2 == 0.0 && t1 * t1 <= t2 * (kB / 16.0) && t2 >= 0x1p-100)) return false;
    K = K2;
    s1 = t1;
    s2 = t2;
    return true;
  }
  // After the last block: its slots, and the min/max of the pass (NaN drops out) merged with rmn, rmx into res.
  void end(float mn, float mx, Partial& res) {
    counter().count_from(0);
    mn = std::min(mn, rmn);
    mx = std::max(mx, rmx);
    res.mn = fmin_nan(res.mn, mn == __builtin_inff() ? __builtin_nan("") : mn);
    res.mx = fmax_nan(res.mx, mx == -__builtin_inff() ? __builtin_nan("") : mx);
  }
};

template <typename T, bool kFloat, int kSub>
int64_t run_one_pass(const T* x, int64_t n, const Params& p, Partial& res, CounterTotals& counters, FloatCount* fh,
                     int64_t* nonfin) {
  const __m256 inf = _mm256_set1_ps(__builtin_inff()), ninf = _mm256_set1_ps(-__builtin_inff());
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const Predicates<Pred8> preds(p);
  const FloatSlots<kSub> slots;
  constexpr bool kBf16Slots = kFloat && std::is_same_v<T, c10::BFloat16>;
  OnePass<T, kFloat, kSub, std::conditional_t<kBf16Slots, uint16_t, uint32_t>> op(x, n, fh);
  __m256 mn = inf, mx = ninf;
  Counts<Lanes8> ctr;
  auto block = [&](int64_t b, auto block_size) {
    constexpr int kB = decltype(block_size)::value, kVecs = kB / kVec;
    auto* fs = op.slots();
    const auto counter = op.counter();
    const __m256 kv = _mm256_set1_ps(op.K);
    __m256 bmn = inf, bmx = ninf;
    __m256d s1v = _mm256_setzero_pd(), s2v = s1v;
    auto one = [&](int j, __m256& c1, __m256& c2) {
      if ((j * kVec * sizeof(T)) % 64 == 0)  // with or without buckets: accumulate_avx512.h says why
        _mm_prefetch(reinterpret_cast<const char*>(x + b + j * kVec) + kPrefetchBytes, _MM_HINT_T0);
      const __m256 v = load8(x + b + j * kVec);
      const __m256 d = _mm256_sub_ps(v, kv);
      c1 = _mm256_add_ps(c1, d);
      c2 = _mm256_fmadd_ps(d, d, c2);
      bmn = _mm256_min_ps(v, bmn);  // NaN drops out; a block with a NaN or Inf is redone anyway
      bmx = _mm256_max_ps(v, bmx);
      ctr.observe(preds, v);
      if constexpr (kFloat && !kBf16Slots) slots.f32(v, _mm256_and_ps(v, abs_mask), fs + j * kVec);
      counter.template count<kVec>(j * kVec);
    };
    for (int g = 0; g < kVecs; g += 8) {
      __m256 c1a = _mm256_setzero_ps(), c1b = c1a, c2a = c1a, c2b = c1a;
      for (int j = g; j < g + 8; j += 2) {
        one(j, c1a, c2a);
        one(j + 1, c1b, c2b);
        if constexpr (kBf16Slots) slots.bf16(x + b + j * kVec, fs + j * kVec);
      }
      s1v = add_halves(s1v, _mm256_add_ps(c1a, c1b));  // 8 values per lane
      s2v = add_halves(s2v, _mm256_add_ps(c2a, c2b));
    }
    counter.count_from(kB);
    const float K = op.K;
    if (op.end_block(x + b, kB, hsum(s1v), hsum(s2v), [&] { return hmin(bmn) == K && hmax(bmx) == K; }, res, nonfin)) {
      mn = _mm256_min_ps(mn, bmn);
      mx = _mm256_max_ps(mx, bmx);
    }
  };
  int64_t b = 0;
  for (; b + kBlock <= n; b += kBlock) block(b, std::integral_constant<int, kBlock>());
  for (; b + kSmallBlock <= n; b += kSmallBlock) block(b, std::integral_constant<int, kSmallBlock>());
  op.end(hmin(mn), hmax(mx), res);
  ctr.add_to(counters.acc);
  return b;
}

// Consumes full blocks of x into res (moments, min/max), counters (the op counters), the histograms h (sub-histogram
// k at h + k * stride), the float buckets fh (copy k of slot s at fh[s * kSub + k], slot kFloatSlots a dummy for
// non-finite values) and nonfin[3] (NaN, +Inf, -Inf counts, kept apart when the linear histogram is off).
// Returns the number of values consumed (a multiple of kSmallBlock); the caller handles the tail.
// Each block is read twice from L1: pass 1 classifies and sums for the shift K, pass 2 sums (v - K)
// and (v - K)^2. Blocks holding a NaN or Inf (known from pass 1's finite count) take a masked slow path.
template <typename T, bool kLin, bool kLog, bool kFloat, int kSub>
int64_t run_blocks(const T* x, int64_t n, const Params& p, Partial& res, CounterTotals& counters,
                   uint32_t* h, int stride, FloatCount* fh, int64_t* nonfin) {
  if constexpr (!kLin && !kLog) return run_one_pass<T, kFloat, kSub>(x, n, p, res, counters, fh, nonfin);
  const int nb = p.nbins;
  const __m256 inf = _mm256_set1_ps(__builtin_inff()), ninf = _mm256_set1_ps(-__builtin_inff());
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 lo = _mm256_set1_ps(p.lo), inv_w = _mm256_set1_ps(p.inv_w);
  const __m256 m1 = _mm256_set1_ps(-1.0f), nbf = _mm256_set1_ps(static_cast<float>(nb));
  const __m256i zero_i = _mm256_setzero_si256();
  // Slots are stored with their copy's offset added (value i counts into copy i % kSub): one base per increment.
  alignas(32) int32_t off[kVec];
  for (int k = 0; k < kVec; ++k) off[k] = (k % kSub) * stride;
  const __m256i lin_off = _mm256_add_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(off)),
                                           _mm256_set1_epi32(1));
  const __m256i log_off = _mm256_add_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(off)),
                                           _mm256_set1_epi32(static_cast<int>(lin_slots(nb)) + 1));
  const FloatSlots<kSub> slots;
  const Predicates<Pred8> preds(p);
  __m256 mn = inf, mx = ninf;
  Counts<Lanes8> ctr;

  alignas(32) float buf[kBlock];
  alignas(32) uint32_t ls[kBlock], gs[kBlock];
  // Float slots of this block and of the previous one. A block counts its even vectors in pass 2 and the previous
  // block's odd vectors in pass 1: the increments (stores) run beside the vector arithmetic of both passes.
  // bfloat16 is float32's top half: its slots come from 16 values at a time, in 16-bit lanes.
  constexpr bool kBf16Slots = kFloat && std::is_same_v<T, c10::BFloat16>;
  using Slot = std::conditional_t<kBf16Slots, uint16_t, uint32_t>;
  alignas(32) Slot fsb[2][kBlock];
  int cur = 0, prev_vecs = 0;
  auto count_float = [&](const Slot* f) {
    if constexpr (kFloat) {
#pragma GCC unroll 8
      for (int i = 0; i < kVec; ++i) ++fh[f[i]];
    }
  };
  // Float buckets of float32: pass 1 has the most vector work and pass 2 the most increments, so min, max and
  // the op counters move to pass 2 (measured: 0.40 -> 0.375 ns/value; slower for the other dtypes and paths).
  constexpr bool kLate = kFloat && std::is_same_v<T, float>;
  auto block = [&](int64_t b, auto block_size) {
    constexpr int kB = decltype(block_size)::value, kVecs = kB / kVec;
    Slot* fs = fsb[cur];
    const Slot* prev = fsb[cur ^ 1];
    // Pass 1: the sum for the shift K, the finite count, the slots and (unless kLate) min, max and the op
    // counters: min_ps(v, m) returns m when v is NaN, so NaNs drop out by themselves; a block with an Inf recomputes
    // them below. Unrolled by two: two add chains.
    __m256 sum0 = _mm256_setzero_ps(), sum1 = sum0, bmn = inf, bmx = ninf;
    __m256i cnt = zero_i;
    auto pass1 = [&](int j, __m256& sum) {
      // Beside the float-bucket increments the loads of x from DRAM ran late: x is asked for 4 KB ahead
      // (measured: 64 MB fp32 0.54 -> 0.43 ns/value; no gain without the increments).
      if (kFloat && (j * kVec * sizeof(T)) % 64 == 0)
        _mm_prefetch(reinterpret_cast<const char*>(x + b + j * kVec) + kPrefetchBytes, _MM_HINT_T0);
      const __m256 v = load8(x + b + j * kVec);
      if constexpr (!std::is_same_v<T, float>) _mm256_store_ps(buf + j * kVec, v);
      const __m256 av = _mm256_and_ps(v, abs_mask);
      const __m256 fin = _mm256_cmp_ps(av, inf, _CMP_LT_OQ);  // false for NaN and +-Inf
      sum = _mm256_add_ps(sum, _mm256_and_ps(v, fin));
      cnt = _mm256_sub_epi32(cnt, _mm256_castps_si256(fin));
      if constexpr (!kLate) {
        bmn = _mm256_min_ps(v, bmn);
        bmx = _mm256_max_ps(v, bmx);
        ctr.observe(preds, v);
      }
      if constexpr (kLin) {
        // accumulator.h lin_slot_finite: t = (v - lo) * inv_w, clamp to [-1, nbins], floor, + 1
        // (non-finite values: below).
        __m256 t = _mm256_mul_ps(_mm256_sub_ps(v, lo), inv_w);
        t = _mm256_min_ps(_mm256_max_ps(t, m1), nbf);
        const __m256i l = _mm256_add_epi32(_mm256_cvttps_epi32(_mm256_floor_ps(t)), lin_off);
        _mm256_store_si256(reinterpret_cast<__m256i*>(ls + j * kVec), l);
      }
      if constexpr (kLog) {
        // accumulator.h log_slot: exponent + 1 for normal values, 1 for subnormals, 0 for zero:
        // exponent + (|v| != 0). NaN and Inf land on 255 + 1 = kLogSlots, the dummy slot.
        const __m256i ab = _mm256_castps_si256(av);
        const __m256i g = _mm256_add_epi32(_mm256_srli_epi32(ab, 23), _mm256_cmpeq_epi32(ab, zero_i));
        _mm256_store_si256(reinterpret_cast<__m256i*>(gs + j * kVec), _mm256_add_epi32(g, log_off));
      }
      if constexpr (kFloat && !kBf16Slots) slots.f32(v, av, fs + j * kVec);
    };
    for (int j = 0; j < kVecs; j += 2) {
      pass1(j, sum0);
      pass1(j + 1, sum1);
      if constexpr (kBf16Slots) slots.bf16(x + b + j * kVec, fs + j * kVec);
      if (j + 1 < prev_vecs) count_float(prev + (j + 1) * kVec);
    }
    for (int j = kVecs + 1; j < prev_vecs; j += 2) count_float(prev + j * kVec);
    const float* vals = std::is_same_v<T, float> ? reinterpret_cast<const float*>(x + b) : buf;
    const int64_t ct = hsum(cnt);
    const bool all_finite = ct == kB;
    if (!all_finite) {
      bmn = inf;
      bmx = ninf;
      for (int j = 0; j < kVecs; ++j) {
        const __m256 v = _mm256_loadu_ps(vals + j * kVec);
        const __m256 fin = _mm256_cmp_ps(_mm256_and_ps(v, abs_mask), inf, _CMP_LT_OQ);
        bmn = _mm256_min_ps(bmn, _mm256_blendv_ps(inf, v, fin));
        bmx = _mm256_max_ps(bmx, _mm256_blendv_ps(ninf, v, fin));
        if constexpr (kLate) ctr.observe(preds, v);
      }
      for (int i = 0; i < kB; ++i) {
        const float v = vals[i];
        if (is_finite(v)) continue;
        const int slot = v != v ? nb + 2 : (v > 0 ? nb + 3 : nb + 4);
        if (kLin) ls[i] = slot + off[i % kVec];
        else ++nonfin[slot - nb - 2];
        if (kFloat) fs[i] = static_cast<Slot>(kFloatSlots * kSub + i % kSub);  // the dummy slot
      }
    }
    // Histograms: the scattered increments of values 8j .. 8j + 7, spread over kSub private copies so that runs
    // of equal slots (ReLU zeros) do not serialise on one counter. Pass 2 calls it beside its vector
    // arithmetic: the increments (stores) and the sums (FP units) then run side by side.
    auto count = [&](int j) {
      const uint32_t *l = ls + j * kVec, *g = gs + j * kVec;
#pragma GCC unroll 8
      for (int i = 0; i < kVec; ++i) {
        if constexpr (kLin) ++h[l[i]];
        if constexpr (kLog) ++h[g[i]];
      }
    };
    if (ct == 0)
      for (int j = 0; j < kVecs; ++j) {
        count(j);
        if (j % 2 == 0) count_float(fs + j * kVec);
      }
    // Pass 2: shifted sums around this block's fp32 mean K; fp32 over 8 values per lane, then fp64.
    if (ct > 0) {
      const float K = hsum(_mm256_add_ps(sum0, sum1)) / static_cast<float>(ct);
      __m256 pmn = inf, pmx = ninf;  // kLate: min, max and the op counters of an all-finite block
      Counts<Lanes8> pctr;
      double s1, s2;
      shifted_sums<false>(vals, kVecs, K, all_finite, s1, s2, [&](int j, __m256 v) {
        if (kLate && all_finite) {
          pmn = _mm256_min_ps(v, pmn);
          pmx = _mm256_max_ps(v, pmx);
          pctr.observe(preds, v);
        }
        count(j);
        if (j % 2 == 0) count_float(fs + j * kVec);
      });
      if (kLate && all_finite) {
        bmn = pmn;
        bmx = pmx;
        ctr.merge(pctr);
      }
      const Partial bp = block_partial(vals, kB, static_cast<int>(ct), K, s1, s2, hmax(bmx) > hmin(bmn));
      chan_merge(res.n, res.mean, res.m2, bp.n, bp.mean, bp.m2);
    }
    mn = _mm256_min_ps(mn, bmn);
    mx = _mm256_max_ps(mx, bmx);
    prev_vecs = kVecs;
    cur ^= 1;
  };
  int64_t b = 0;
  for (; b + kBlock <= n; b += kBlock) block(b, std::integral_constant<int, kBlock>());
  for (; b + kSmallBlock <= n; b += kSmallBlock) block(b, std::integral_constant<int, kSmallBlock>());
  for (int j = 1; j < prev_vecs; j += 2) count_float(fsb[cur ^ 1] + j * kVec);
  const float fmn = hmin(mn), fmx = hmax(mx);
  res.mn = fmin_nan(res.mn, fmn == __builtin_inff() ? __builtin_nan("") : fmn);
  res.mx = fmax_nan(res.mx, fmx == -__builtin_inff() ? __builtin_nan("") : fmx);
  ctr.add_to(counters.acc);
  return b;
}

}  // namespace avx2
}  // namespace hookstats

#pragma GCC pop_options
