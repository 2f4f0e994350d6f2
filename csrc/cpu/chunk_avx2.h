// chunk_avx2.h -- the AVX2 chunk kernel of the CPU op for float32, float16 (F16C) and bfloat16 inputs.
// Same results as the portable ChunkKernel of stats_cpu.cpp: slots from the accumulator.h formulas (no FMA
// in the bin formula), fp32 sums over <= 8 values per lane then fp64, one fp32 shift K per 256-value block.
#pragma once
#include <immintrin.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <type_traits>

#include "../accumulator.h"

// Everything below, lambdas included, is compiled for AVX2; stats_cpu.cpp calls it only where the CPU has it.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,popcnt")

namespace hookstats {
namespace avx2 {

constexpr int kVec = 8;
constexpr int kBlock = 256;  // values per shift K and per moment merge
constexpr int kVecs = kBlock / kVec;

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

// Moments of one chunk: min/max/near-zero lanes live across blocks, (n, mean, M2) merge once per block.
struct Lanes {
  __m256 mn, mx;
  __m256i nz;
};

// Consumes full blocks of x into res (moments, min/max, near-zero), the histograms h (sub-histogram
// k at h + k * stride) and nonfin[3] (NaN, +Inf, -Inf counts, kept apart when the linear histogram is off).
// Returns the number of values consumed (a multiple of kBlock); the caller handles the tail.
template <typename T, bool kLin, bool kLog, int kSub>
int64_t run_blocks(const T* x, int64_t n, const Params& p, Partial& res, int64_t& near_zero,
                           uint32_t* h, int stride, int64_t* nonfin) {
  const int nb = p.nbins;
  const int lin_n = static_cast<int>(lin_slots(nb));
  const __m256 inf = _mm256_set1_ps(__builtin_inff()), ninf = _mm256_set1_ps(-__builtin_inff());
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), exp_all = _mm256_set1_epi32(0x7f800000);
  const __m256 lo = _mm256_set1_ps(p.lo), inv_w = _mm256_set1_ps(p.inv_w), eps = _mm256_set1_ps(p.eps);
  const __m256 m1 = _mm256_set1_ps(-1.0f), nbf = _mm256_set1_ps(static_cast<float>(nb));
  const __m256i one = _mm256_set1_epi32(1), slot_ninf = _mm256_set1_epi32(nb + 4);
  const __m256i slot_nan = _mm256_set1_epi32(nb + 2), log_base = _mm256_set1_epi32(lin_n);
  const bool signed_nz = p.flags & kSignedNearZero;
  Lanes ln{inf, ninf, _mm256_setzero_si256()};

  alignas(32) float buf[kBlock];
  alignas(32) int32_t ls[kBlock], gs[kBlock];
  const int64_t full = n / kBlock * kBlock;
  for (int64_t b = 0; b < full; b += kBlock) {
    // Pass 1: convert, classify, sum for the shift, min/max, near-zero, slots. Unrolled by two so
    // that the sum chains are two (add latency, not throughput, bounds a single chain).
    __m256 sum0 = _mm256_setzero_ps(), sum1 = sum0;
    __m256i cnt = _mm256_setzero_si256();
    int nonfinite = 0;
    auto pass1 = [&](int j, __m256& sum) {
      const __m256 v = load8(x + b + j * kVec);
      if constexpr (!std::is_same_v<T, float>) _mm256_store_ps(buf + j * kVec, v);
      const __m256i bits = _mm256_castps_si256(v);
      const __m256i absb = _mm256_and_si256(bits, abs_mask);
      const __m256i fin_i = _mm256_cmpgt_epi32(exp_all, absb);
      const __m256 fin = _mm256_castsi256_ps(fin_i);
      nonfinite |= ~_mm256_movemask_ps(fin) & 0xff;
      sum = _mm256_add_ps(sum, _mm256_and_ps(v, fin));
      cnt = _mm256_sub_epi32(cnt, fin_i);
      ln.mn = _mm256_min_ps(ln.mn, _mm256_blendv_ps(inf, v, fin));
      ln.mx = _mm256_max_ps(ln.mx, _mm256_blendv_ps(ninf, v, fin));
      const __m256 a = signed_nz ? v : _mm256_castsi256_ps(absb);
      ln.nz = _mm256_sub_epi32(ln.nz, _mm256_castps_si256(_mm256_cmp_ps(a, eps, _CMP_LE_OQ)));
      if constexpr (kLin) {
        // accumulator.h lin_slot: t = (v - lo) * inv_w, clamp to [-1, nbins], floor, + 1.
        __m256 t = _mm256_mul_ps(_mm256_sub_ps(v, lo), inv_w);
        t = _mm256_max_ps(t, m1);
        t = _mm256_min_ps(t, nbf);
        const __m256i s = _mm256_add_epi32(_mm256_cvttps_epi32(_mm256_floor_ps(t)), one);
        const __m256 pos = _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_GT_OQ);
        const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
        __m256i nf = _mm256_add_epi32(slot_ninf, _mm256_castps_si256(pos));  // +Inf: nb + 3
        nf = _mm256_blendv_epi8(nf, slot_nan, _mm256_castps_si256(nan));
        const __m256i lin = _mm256_blendv_epi8(nf, s, fin_i);
        _mm256_store_si256(reinterpret_cast<__m256i*>(ls + j * kVec), lin);
      }
      if constexpr (kLog) {
        // accumulator.h log_slot: exponent + 1, or 0 / 1 for zero / subnormal; NaN and Inf land on
        // exponent 255 + 1 = kLogSlots, the dummy slot past the log2 histogram.
        const __m256i e = _mm256_srli_epi32(absb, 23);
        const __m256i is_zero_exp = _mm256_cmpeq_epi32(e, _mm256_setzero_si256());
        const __m256i nonzero = _mm256_andnot_si256(_mm256_cmpeq_epi32(absb, _mm256_setzero_si256()), one);
        const __m256i g = _mm256_blendv_epi8(_mm256_add_epi32(e, one), nonzero, is_zero_exp);
        _mm256_store_si256(reinterpret_cast<__m256i*>(gs + j * kVec), _mm256_add_epi32(g, log_base));
      }
    };
    for (int j = 0; j < kVecs; j += 2) {
      pass1(j, sum0);
      pass1(j + 1, sum1);
    }
    const float* vals = std::is_same_v<T, float> ? reinterpret_cast<const float*>(x + b) : buf;
    if (!kLin && nonfinite) {
      for (int i = 0; i < kBlock; ++i) {
        const float v = vals[i];
        if (!is_finite(v)) ++nonfin[v != v ? 0 : (v > 0 ? 1 : 2)];
      }
    }
    // Pass 2: shifted sums around this block's fp32 mean K; fp32 over 8 values per lane, then fp64.
    const int64_t ct = hsum(cnt);
    if (ct > 0) {
      const float K = hsum(_mm256_add_ps(sum0, sum1)) / static_cast<float>(ct);
      const __m256 kv = _mm256_set1_ps(K);
      __m256d s1a = _mm256_setzero_pd(), s1b = s1a, s2a = s1a, s2b = s1a;
      auto pass2 = [&](int j, __m256& c1, __m256& c2) {
        const __m256 v = _mm256_loadu_ps(vals + j * kVec);
        const __m256i absb = _mm256_and_si256(_mm256_castps_si256(v), abs_mask);
        const __m256 fin = _mm256_castsi256_ps(_mm256_cmpgt_epi32(exp_all, absb));
        const __m256 d = _mm256_and_ps(_mm256_sub_ps(v, kv), fin);
        c1 = _mm256_add_ps(c1, d);
        c2 = _mm256_add_ps(c2, _mm256_mul_ps(d, d));
      };
      for (int g = 0; g < kVecs; g += 8) {
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
      Partial bp;
      shifted_to_partial(bp, static_cast<double>(ct), K, hsum(_mm256_add_pd(s1a, s1b)),
                         hsum(_mm256_add_pd(s2a, s2b)));
      chan_merge(res.n, res.mean, res.m2, bp.n, bp.mean, bp.m2);
    }
    // Histograms: two scattered increments per value, spread over kSub private copies so that runs of
    // equal slots (ReLU zeros) do not serialise on one counter.
    if constexpr (kLin || kLog) {
      for (int i = 0; i < kBlock; i += kSub) {
        for (int k = 0; k < kSub; ++k) {
          uint32_t* hk = h + k * stride;
          if constexpr (kLin) ++hk[ls[i + k]];
          if constexpr (kLog) ++hk[gs[i + k]];
        }
      }
    }
  }
  const float mn = hmin(ln.mn), mx = hmax(ln.mx);
  res.mn = fmin_nan(res.mn, mn == __builtin_inff() ? __builtin_nan("") : mn);
  res.mx = fmax_nan(res.mx, mx == -__builtin_inff() ? __builtin_nan("") : mx);
  near_zero += hsum(ln.nz);
  return full;
}

}  // namespace avx2
}  // namespace hookstats

#pragma GCC pop_options
