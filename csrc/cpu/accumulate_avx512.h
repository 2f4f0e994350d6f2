// accumulate_avx512.h -- the AVX-512 kernel of the op without linear and log2 histograms (its defaults): the one
// pass per block of accumulate_avx2.h's run_one_pass, 16 values a vector, the op counters from mask registers and
// 32 vector registers (the AVX2 loop spills); blocks to redo go to the same AVX2 code (OnePass::end_block).
#pragma once
#include "accumulate_avx2.h"

// Everything below is compiled for AVX-512 (F, BW, VL, DQ); accumulate_cpu_kernel.h calls it only where the CPU has it.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,popcnt")
// g++ 12 reports the intrinsics' own _mm512_undefined_* placeholders as uninitialised (a false positive)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace hookstats {
namespace avx512 {

constexpr int kVec = 16;

template <typename T>
inline __m512 load16(const T* x) {
  if constexpr (std::is_same_v<T, float>) {
    return _mm512_loadu_ps(x);
  } else if constexpr (std::is_same_v<T, c10::Half>) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
  } else {
    static_assert(std::is_same_v<T, c10::BFloat16>);
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
}

// s + the 16 fp32 lanes of c in fp64
inline __m512d add_halves(__m512d s, __m512 c) {
  const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(c));
  const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(c), 1)));
  return _mm512_add_pd(s, _mm512_add_pd(lo, hi));
}

template <typename T, bool kFloat, int kSub>
int64_t run_one_pass(const T* x, int64_t n, const Params& p, Partial& res, CounterTotals& counters, FloatCount* fh,
                     int64_t* nonfin) {
  static_assert(kSub == 2 || kSub == 4 || kSub == 8, "the copies of a float bucket are side by side");
  const __m512 inf = _mm512_set1_ps(__builtin_inff()), ninf = _mm512_set1_ps(-__builtin_inff());
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  const Predicates<Pred16> preds(p);
  // float slots (accumulator.h float_slot) with their copy's offset: value i counts into copy i % kSub
  const __m512i float_zero = _mm512_set1_epi32(kFloatZero), abs16 = _mm512_set1_epi16(0x7fff);
  const __m512i float_zero16 = _mm512_set1_epi16(kFloatZero);
  alignas(64) int16_t o16[2 * kVec];
  for (int k = 0; k < 2 * kVec; ++k) o16[k] = static_cast<int16_t>(k % kSub);
  const __m512i off16 = _mm512_load_si512(o16), off = _mm512_cvtepu16_epi32(_mm256_load_si256(
      reinterpret_cast<const __m256i*>(o16)));
  constexpr bool kBf16Slots = kFloat && std::is_same_v<T, c10::BFloat16>;
  avx2::OnePass<T, kFloat, kSub, uint16_t> op(x, n, fh);
  __m512 mn = inf, mx = ninf;
  Counts<Lanes16> ctr;
  auto block = [&](int64_t b, auto block_size) {
    constexpr int kB = decltype(block_size)::value, kVecs = kB / kVec;
    uint16_t* fs = op.slots();
    const auto counter = op.counter();
    const __m512 kv = _mm512_set1_ps(op.K);
    __m512 bmn = inf, bmx = ninf;
    __m512d s1v = _mm512_setzero_pd(), s2v = s1v;
    auto one = [&](int j, __m512& c1, __m512& c2) {
      // x asked for 4 KB ahead, with or without buckets: in a training step x was just written by its layer and sits
      // in L3, whose latency the hardware prefetcher hid poorly (benchmark CNN, the op without histograms inside
      // the step: 6.2 -> 4.3 ms a step with the reshift: benchmarks/hist_cadence.py, b3a9846 against 69b262a)
      if ((j * kVec * sizeof(T)) % 64 == 0)
        _mm_prefetch(reinterpret_cast<const char*>(x + b + j * kVec) + avx2::kPrefetchBytes, _MM_HINT_T0);
      const __m512 v = load16(x + b + j * kVec);
      const __m512 d = _mm512_sub_ps(v, kv);
      c1 = _mm512_add_ps(c1, d);
      c2 = _mm512_fmadd_ps(d, d, c2);
      bmn = _mm512_min_ps(v, bmn);  // NaN drops out; a block with a NaN or Inf is redone anyway
      bmx = _mm512_max_ps(v, bmx);
      const __m512i bits = _mm512_castps_si512(v);
      ctr.observe(preds, v);
      if constexpr (kFloat && !kBf16Slots) {  // bits >> 20, zeros of either sign to kFloatZero, in 16 bits
        const __mmask16 zero = _mm512_testn_epi32_mask(bits, abs_mask);
        const __m512i f = _mm512_mask_mov_epi32(_mm512_srli_epi32(bits, kFloatShift), zero, float_zero);
        const __m512i fk = _mm512_add_epi32(_mm512_slli_epi32(f, __builtin_ctz(kSub)), off);
        _mm256_store_si256(reinterpret_cast<__m256i*>(fs + j * kVec), _mm512_cvtepi32_epi16(fk));
      }
      counter.template count<kVec>(j * kVec);
    };
    for (int g = 0; g < kVecs; g += 8) {
      __m512 c1a = _mm512_setzero_ps(), c1b = c1a, c2a = c1a, c2b = c1a;
      for (int j = g; j < g + 8; j += 2) {
        one(j, c1a, c2a);
        one(j + 1, c1b, c2b);
        if constexpr (kBf16Slots) {  // the same from the bf16 bits, 32 at a time: bits16 >> 4
          const __m512i w = _mm512_loadu_si512(x + b + j * kVec);
          const __m512i f = _mm512_mask_mov_epi16(_mm512_srli_epi16(w, kFloatShift - 16),
                                                  _mm512_testn_epi16_mask(w, abs16), float_zero16);
          _mm512_store_si512(fs + j * kVec, _mm512_add_epi16(_mm512_slli_epi16(f, __builtin_ctz(kSub)), off16));
        }
      }
      s1v = add_halves(s1v, _mm512_add_ps(c1a, c1b));  // 8 values per lane
      s2v = add_halves(s2v, _mm512_add_ps(c2a, c2b));
    }
    counter.count_from(kB);
    const float K = op.K;
    if (op.end_block(x + b, kB, _mm512_reduce_add_pd(s1v), _mm512_reduce_add_pd(s2v),
                     [&] { return _mm512_reduce_min_ps(bmn) == K && _mm512_reduce_max_ps(bmx) == K; }, res, nonfin)) {
      mn = _mm512_min_ps(mn, bmn);
      mx = _mm512_max_ps(mx, bmx);
    }
  };
  int64_t b = 0;
  for (; b + avx2::kBlock <= n; b += avx2::kBlock) block(b, std::integral_constant<int, avx2::kBlock>());
  for (; b + avx2::kSmallBlock <= n; b += avx2::kSmallBlock) block(b, std::integral_constant<int, avx2::kSmallBlock>());
  op.end(_mm512_reduce_min_ps(mn), _mm512_reduce_max_ps(mx), res);
  ctr.add_to(counters.acc);
  return b;
}

}  // namespace avx512
}  // namespace hookstats

#pragma GCC diagnostic pop
#pragma GCC pop_options
