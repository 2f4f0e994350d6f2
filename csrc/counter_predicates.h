// counter_predicates.h -- each op counter's predicate, one per width, and the widths' accumulators (counters.h's
// Counts<W>): the CPU's scalar loop (PredScalar), AVX2 (avx2::Pred8, 8 values a vector), AVX-512 (avx512::Pred16),
// the CUDA kernel's values as float32 (PredOne) and its 16-bit values two to a word (PredPair). A predicate is a
// specialisation for its counter's istate slot (PredScalar<kNearZero>, ...); a counter with a width's predicate
// missing does not compile. They agree with accumulator.h's one-value definition (near_zero) on every value.
#pragma once
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "counters.h"

namespace hookstats {

// ---- the CPU's scalar loop (cpu/accumulate_cpu_kernel.h ChunkKernel): one value, int32 per lane ----
// f: the value as float32 (bin_value); valid: whether the lane holds a value.
template <int Slot> struct PredScalar;

// accumulator.h near_zero spelled out (called there, it changed the loop's code: float64 ~3% slower).
template <> struct PredScalar<kNearZero> {
  float eps;
  bool signed_mode;
  explicit PredScalar(const Params& p) : eps(p.eps), signed_mode(p.flags & kSignedNearZero) {}
  HS_COUNTS_FN void count(int32_t& a, const float& f, const bool& valid) const {
    const float m = signed_mode ? f : (f < 0 ? -f : f);
    a += valid && (m <= eps);
  }
};

}  // namespace hookstats

#if defined(__x86_64__) && !defined(__CUDACC__) && !defined(HS_CPU_EMULATION)
#include <immintrin.h>

// ---- AVX2 (cpu/accumulate_avx2.h): 8 float32 values, int32 lanes ----
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,popcnt")
namespace hookstats {
namespace avx2 {

// A counter's 8 lanes, each its count of the values in that lane.
struct Lanes8 {
  using Acc = __m256i;
  static void merge(__m256i& a, const __m256i& b) { a = _mm256_add_epi32(a, b); }
  static int64_t total(const __m256i& a) {
    alignas(32) int32_t l[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(l), a);
    int64_t s = 0;
    for (int j = 0; j < 8; ++j) s += l[j];
    return s;
  }
};

template <int Slot> struct Pred8;

// v & mask (all ones in the signed mode: v itself; else the sign cleared: |v|) at or below eps; the true lanes (-1
// each) are subtracted from a.
template <> struct Pred8<kNearZero> {
  __m256 mask, eps;
  explicit Pred8(const Params& p)
      : mask(_mm256_castsi256_ps(_mm256_set1_epi32((p.flags & kSignedNearZero) ? -1 : 0x7fffffff))),
        eps(_mm256_set1_ps(p.eps)) {}
  void count(__m256i& a, const __m256& v) const {
    a = _mm256_sub_epi32(a, _mm256_castps_si256(_mm256_cmp_ps(_mm256_and_ps(v, mask), eps, _CMP_LE_OQ)));
  }
};

}  // namespace avx2
}  // namespace hookstats
#pragma GCC pop_options

// ---- AVX-512 (cpu/accumulate_avx512.h): 16 float32 values, int32 lanes, the predicate in a mask register ----
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,popcnt")
namespace hookstats {
namespace avx512 {

struct Lanes16 {
  using Acc = __m512i;
  static void merge(__m512i& a, const __m512i& b) { a = _mm512_add_epi32(a, b); }
  static int64_t total(const __m512i& a) {
    return _mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_cvtepi32_epi64(_mm512_castsi512_si256(a)),
                                                    _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(a, 1))));
  }
};

template <int Slot> struct Pred16;

// v's bits & mask (v itself in the signed mode, else |v|) at or below eps, in a mask register; a's true lanes take
// -all (all = -1: + 1).
template <> struct Pred16<kNearZero> {
  __m512i mask, all;
  __m512 eps;
  explicit Pred16(const Params& p)
      : mask(_mm512_set1_epi32((p.flags & kSignedNearZero) ? -1 : 0x7fffffff)), all(_mm512_set1_epi32(-1)),
        eps(_mm512_set1_ps(p.eps)) {}
  void count(__m512i& a, const __m512& v) const {
    const __mmask16 z = _mm512_cmp_ps_mask(_mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), mask)), eps,
                                           _CMP_LE_OQ);
    a = _mm512_mask_sub_epi32(a, z, a, all);
  }
};

}  // namespace avx512
}  // namespace hookstats
#pragma GCC pop_options
#endif  // x86-64 CPU

#if defined(__CUDACC__) || defined(HS_CPU_EMULATION)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace hookstats {

// ---- the CUDA kernel (cuda/accumulate_kernel.cuh) ----
// A thread's counts in float32: each value adds 1.0f or 0.0f (one FSET, summed by one FADD); exact, as a thread sees
// < 2^23 values (max_block_elems).
struct ThreadLanes {
  using Acc = float;
  HS_COUNTS_FN static void merge(float& a, const float& b) { a += b; }
  HS_COUNTS_FN static unsigned total(const float& a) { return static_cast<unsigned>(a); }
};

// One value as float32 (bin_value).
template <int Slot> struct PredOne;

template <> struct PredOne<kNearZero> {
  float eps;
  bool signed_mode;
  HS_COUNTS_FN explicit PredOne(const Params& p) : eps(p.eps), signed_mode(p.flags & kSignedNearZero) {}
  HS_COUNTS_FN void count(float& a, const float& v) const {
#if defined(__CUDA_ARCH__)
    float m;
    if (signed_mode) asm("set.le.f32.f32 %0, %1, %2;" : "=f"(m) : "f"(v), "f"(eps));
    else asm("set.le.f32.f32 %0, %1, %2;" : "=f"(m) : "f"(fabsf(v)), "f"(eps));
    a += m;
#else
    a += near_zero(v, eps, signed_mode) ? 1.0f : 0.0f;
#endif
  }
};

// 16-bit values (bf16, fp16) two to a word, P (__nv_bfloat162, __half2): each half counts its own, 1 or 0 per value,
// exact below 256 (a chunk's counts; the thread adds both halves to its ThreadLanes).
template <typename P>
struct PairLanes {
  using Acc = P;
  HS_COUNTS_FN static void merge(P& a, const P& b) { a = __hadd2(a, b); }
  HS_COUNTS_FN static float total(const P& a) {
    if constexpr (std::is_same_v<P, __nv_bfloat162>) {  // float32's top halves: a shift and a mask
      uint32_t u;
      memcpy(&u, &a, sizeof(u));
      float lo, hi;
      const uint32_t ul = u << 16, uh = u & 0xffff0000u;
      memcpy(&lo, &ul, sizeof(lo));
      memcpy(&hi, &uh, sizeof(hi));
      return lo + hi;
    } else {
      return __low2float(a) + __high2float(a);
    }
  }
};

template <typename T, int Slot> struct PredPair;

// x (signed mode) or |x| at or below eps rounded down to T: v <= eps in T exactly when it holds in float32.
template <typename T> struct PredPair<T, kNearZero> {
  using P = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
  P eps;
  bool signed_mode;
  HS_COUNTS_FN explicit PredPair(const Params& p) : signed_mode(p.flags & kSignedNearZero) {
    T e;
    if constexpr (std::is_same_v<T, __half>) e = __float2half_rd(p.eps);
    else e = __float2bfloat16_rd(p.eps);
    eps = P(e, e);
  }
  HS_COUNTS_FN void first(P& a, const P& x) const { a = __hle2(signed_mode ? x : __habs2(x), eps); }
  HS_COUNTS_FN void count(P& a, const P& x) const { a = __hadd2(a, __hle2(signed_mode ? x : __habs2(x), eps)); }
};
// PredPair of one T as Predicates takes it (a template of the slot alone).
template <typename T>
struct PairPredicates {
  template <int Slot> using of = PredPair<T, Slot>;
};

}  // namespace hookstats
#endif  // CUDA
