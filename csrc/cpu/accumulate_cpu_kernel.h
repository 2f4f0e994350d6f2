// accumulate_cpu_kernel.h -- the CPU kernel's chunked loops as templates: the portable ChunkKernel, the AVX2 and
// AVX-512 ones it hands full blocks to, the task-private histograms and their flush. Each dtype is instantiated in a
// file of its own (accumulate_cpu_f32.cpp, ...), so the four compile in parallel; accumulate_cpu.cpp dispatches.
// at::parallel_for over fixed-size chunks (sized from numel only) whose moments merge in chunk order,
// so the state is identical for any thread count. Integer statistics are summed, which is order-free: each
// task counts into private histograms (32-bit; 16-bit for the float buckets) and adds them to the state at its
// end, or before a counter could wrap.
#pragma once
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "../accumulator.h"
#include "../counter_predicates.h"
#include "accumulate_avx512.h"
#include "accumulate_cpu_typed.h"

namespace hookstats {
namespace cpu {

constexpr int kBlock = 64;  // values consumed together; fp32 partial sums per lane, fp64 across blocks
constexpr int kLanes = 8;   // each lane sums kBlock / kLanes = 8 values in fp32, then fp64 across blocks
constexpr int kSubHists = 4;  // private copies, so repeated bins do not serialise on one counter
constexpr int64_t kMinChunk = int64_t(1) << 15;
constexpr int64_t kMaxChunks = 1024;
constexpr int kMaxHistStride = kMaxBins + kLinExtra + kLogSlots + 1;  // +1: dummy log slot for non-finite
// Float buckets, then a dummy slot for non-finite values; the kSubHists copies of a slot are side by side, so the
// few hot slots of a tensor take few cache lines, spread over the cache's sets (copies 16 KB apart all fall in
// the same sets, and streaming x through the cache then evicts them).
constexpr int kFloatDummy = kFloatSlots;
constexpr int kFloatHistSize = (kFloatSlots + 1) * kSubHists;
constexpr int64_t kFlushEvery = int64_t(1) << 31;  // values per flush of the private histograms: no u32 wraps
// The same for the 16-bit float buckets: each copy counts a quarter of the values (+1 at a run's end), so up to
// 65280 + a few; a multiple of the AVX2 block, so that pieces of a chunk end on whole blocks.
constexpr int64_t kFloatFlushEvery = 255 * 1024;
// Pieces up to this many values are flushed by the float buckets their values' range touched, larger ones by
// reading the whole table (32 KB), which costs about as much as a range pass over this many values.
constexpr int64_t kFloatRangeMax = 4096;

inline int hist_stride(int nbins) { return static_cast<int>(lin_slots(nbins)) + kLogSlots + 1; }

// Adds the kSubHists copies (stride apart) of slots [0, n) to dst and zeroes them.
inline void flush_hist(uint32_t* h, int stride, int n, int64_t* dst) {
  for (int s = 0; s < n; ++s) {
    uint32_t t = 0;  // < 2^32: at most kFlushEvery values were counted since the last flush
    for (int k = 0; k < kSubHists; ++k) {
      t += h[k * stride + s];
      h[k * stride + s] = 0;
    }
    if (t) __atomic_fetch_add(&dst[s], static_cast<int64_t>(t), __ATOMIC_RELAXED);
  }
}

// The float buckets of the calling thread, allocated once and zero between calls (flush_float zeroes them):
// 32 KB, too much to clear for every small tensor.
struct alignas(64) FloatHist {
  FloatCount c[kFloatHistSize] = {};
};
inline FloatCount* float_hist_of_thread() {
  thread_local std::unique_ptr<FloatHist> hist;
  if (!hist) hist = std::make_unique<FloatHist>();
  return hist->c;
}

// Float buckets per 64-byte line of the table: 8 slots (their kSubHists copies side by side).
constexpr int kFloatLine = 64 / sizeof(FloatCount);
constexpr int kLineSlots = kFloatLine / kSubHists;
static_assert(kFloatLine % kSubHists == 0 && kFloatHalf % kLineSlots == 0, "a line holds whole slots of one sign");

// Adds the float buckets of slots [first, end) (whole lines) to dst and zeroes them. A tensor touches a few dozen
// buckets: most lines are zero and only read.
inline void flush_float_lines(FloatCount* fh, int64_t* dst, int first, int end) {
  constexpr int kLine = kFloatLine, kLanes = 16 / sizeof(FloatCount);
  using Lanes = FloatCount __attribute__((vector_size(16)));  // SSE2 on every x86-64: 4 loads a line
  for (int base = first * kSubHists; base < end * kSubHists; base += kLine) {
    Lanes any = {}, v;
    for (int i = 0; i < kLine; i += kLanes) {
      memcpy(&v, fh + base + i, sizeof(v));
      any |= v;
    }
    uint64_t nonzero[2];
    memcpy(nonzero, &any, sizeof(any));
    if ((nonzero[0] | nonzero[1]) == 0) continue;
    for (int s = base / kSubHists; s < (base + kLine) / kSubHists; ++s) {
      uint32_t t = 0;
      for (int k = 0; k < kSubHists; ++k) t += fh[s * kSubHists + k];
      if (t) __atomic_fetch_add(&dst[s], static_cast<int64_t>(t), __ATOMIC_RELAXED);
    }
    std::fill(fh + base, fh + base + kLine, FloatCount(0));
  }
}

// The magnitude part (slot & (kFloatHalf - 1)) of the float buckets the finite values since the last flush may
// have touched: [lo, hi], in whole lines; lo > hi: none. The last line of each half (zero; float64's below/above
// slots; the slots of Inf/NaN bits) is always flushed.
struct FloatRange {
  int lo = kFloatHalf, hi = -1;
  void widen(int l, int h) {
    lo = std::min(lo, l);
    hi = std::max(hi, h);
  }
};

// Adds the float buckets in range to dst and zeroes them, the dummy slot too: all a flush need read, as no other
// line was touched.
inline void flush_float(FloatCount* fh, int64_t* dst, const FloatRange& r) {
  constexpr int kLast = kFloatHalf - kLineSlots;
  const int lo = r.lo / kLineSlots * kLineSlots, hi = std::min(r.hi / kLineSlots * kLineSlots + kLineSlots, kLast);
  for (int half = 0; half < kFloatSlots; half += kFloatHalf) {
    if (lo < hi) flush_float_lines(fh, dst, half + lo, half + hi);
    flush_float_lines(fh, dst, half + kLast, half + kFloatHalf);
  }
  std::fill(fh + kFloatDummy * kSubHists, fh + kFloatHistSize, FloatCount(0));
}

// Magnitude bits of a value's storage, compared as unsigned: their order is the order of |v|.
template <typename T> struct MagBits;
template <> struct MagBits<float> { using U = uint32_t; static constexpr U kMask = 0x7fffffffu, kInf = 0x7f800000u; };
template <> struct MagBits<c10::Half> { using U = uint16_t; static constexpr U kMask = 0x7fff, kInf = 0x7c00; };
template <> struct MagBits<c10::BFloat16> { using U = uint16_t; static constexpr U kMask = 0x7fff, kInf = 0x7f80; };

// (smallest nonzero magnitude - 1, largest finite magnitude) of x[i, n), into lo and hi: zero wraps above
// everything in lo; NaN/Inf count as 0 in hi.
template <typename T, typename U = typename MagBits<T>::U>
void mag_range_scalar(const T* x, int64_t i, int64_t n, U& lo, U& hi) {
  for (; i < n; ++i) {
    U u;
    memcpy(&u, x + i, sizeof(U));
    u &= MagBits<T>::kMask;
    const U below = static_cast<U>(u - 1);
    lo = below < lo ? below : lo;
    const U fin = u < MagBits<T>::kInf ? u : U(0);
    hi = fin > hi ? fin : hi;
  }
}
// The same, 32 bytes at a time (gcc does not vectorise the two reductions).
template <typename T, typename U = typename MagBits<T>::U>
__attribute__((target("avx2"))) void mag_range_avx2(const T* x, int64_t n, U& lo, U& hi) {
  constexpr bool k16 = sizeof(U) == 2;
  constexpr int64_t kStep = 32 / sizeof(U);
  const __m256i mask = k16 ? _mm256_set1_epi16(static_cast<int16_t>(MagBits<T>::kMask))
                           : _mm256_set1_epi32(static_cast<int32_t>(MagBits<T>::kMask));
  const __m256i inf = k16 ? _mm256_set1_epi16(static_cast<int16_t>(MagBits<T>::kInf))
                          : _mm256_set1_epi32(static_cast<int32_t>(MagBits<T>::kInf));
  const __m256i one = k16 ? _mm256_set1_epi16(1) : _mm256_set1_epi32(1);
  __m256i vlo = _mm256_set1_epi32(-1), vhi = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + kStep <= n; i += kStep) {
    const __m256i u = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), mask);
    if constexpr (k16) {  // magnitudes < 2^15: the signed compare is exact
      vlo = _mm256_min_epu16(vlo, _mm256_sub_epi16(u, one));
      vhi = _mm256_max_epu16(vhi, _mm256_and_si256(u, _mm256_cmpgt_epi16(inf, u)));
    } else {
      vlo = _mm256_min_epu32(vlo, _mm256_sub_epi32(u, one));
      vhi = _mm256_max_epu32(vhi, _mm256_and_si256(u, _mm256_cmpgt_epi32(inf, u)));
    }
  }
  alignas(32) U a[kStep], b[kStep];
  _mm256_store_si256(reinterpret_cast<__m256i*>(a), vlo);
  _mm256_store_si256(reinterpret_cast<__m256i*>(b), vhi);
  for (int k = 0; k < kStep; ++k) {
    lo = a[k] < lo ? a[k] : lo;
    hi = b[k] > hi ? b[k] : hi;
  }
  mag_range_scalar(x, i, n, lo, hi);
}

// The float buckets x[0, n) touches, from its smallest nonzero and largest finite magnitude (float_slot is
// monotonic in |v| within a sign). One pass over x in cache: for small pieces, where it is far cheaper than reading
// the whole table. float64 (whose below/above slots break the order): every line.
template <typename T>
FloatRange float_range(const T* x, int64_t n, bool avx2) {
  FloatRange r;
  if constexpr (std::is_same_v<T, double>) {
    r.widen(0, kFloatHalf - 1);
  } else {
    using U = typename MagBits<T>::U;
    U lo = std::numeric_limits<U>::max(), hi = 0;
    if (avx2) mag_range_avx2(x, n, lo, hi);
    else mag_range_scalar(x, 0, n, lo, hi);
    if (hi == 0) return r;  // zeros and non-finite values only: the last lines and the dummy
    const auto slot = [](U bits) {
      T v;
      memcpy(&v, &bits, sizeof(U));
      return float_slot(static_cast<float>(v));
    };
    r.widen(slot(static_cast<U>(lo + 1)), slot(hi));
  }
  return r;
}

template <typename T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

struct ChunkResult {
  Partial moments;
  CounterTotals counters;
};

template <typename T, bool kLin, bool kLog, bool kFloat>
struct ChunkKernel {
  using A = acc_t<T>;
  using LaneCounts = Counts<Tally<int32_t>>;  // one lane's op counters
  Params p;
  int stride;  // of the sub-histograms in h

  // Consumes x[0, n) (n < 2^31) into res, the task-local histograms h (kSubHists x stride) and the float
  // buckets fh (kFloatHistSize: copy k of slot s at s * kSubHists + k).
  void run(const T* x, int64_t n, ChunkResult& res, uint32_t* h, FloatCount* fh) const {
    A mn[kLanes], mx[kLanes];
    LaneCounts ctr[kLanes];
    for (int j = 0; j < kLanes; ++j) {
      mn[j] = std::numeric_limits<A>::infinity();
      mx[j] = -std::numeric_limits<A>::infinity();
    }
    int64_t i = 0;
    for (; i + kBlock <= n; i += kBlock) block<true>(x + i, kBlock, res, h, fh, mn, mx, ctr);
    if (i < n) block<false>(x + i, static_cast<int>(n - i), res, h, fh, mn, mx, ctr);
    for (int j = 0; j < kLanes; ++j) {
      res.moments.mn = fmin_nan(res.moments.mn, mn[j] == std::numeric_limits<A>::infinity() ? NAN : mn[j]);
      res.moments.mx = fmax_nan(res.moments.mx, mx[j] == -std::numeric_limits<A>::infinity() ? NAN : mx[j]);
      ctr[j].add_to(res.counters.acc);
    }
  }

  template <bool kFull>
  void block(const T* x, int m_in, ChunkResult& res, uint32_t* h, FloatCount* fh, A* mn, A* mx,
             LaneCounts* ctr) const {
    const int m = kFull ? kBlock : m_in;
    A v[kBlock];
    bool fin[kBlock];
    for (int i = 0; i < kBlock; ++i) {
      v[i] = i < m ? static_cast<A>(x[i]) : A(0);
      fin[i] = i < m && (v[i] - v[i] == A(0));  // false for NaN and +-Inf
    }
    // Shift K = this block's mean in fp32: keeps |mean - K| << sigma even beside huge outliers.
    A s[kLanes] = {};
    int32_t c[kLanes] = {};
    for (int b = 0; b < kBlock; b += kLanes)
      for (int j = 0; j < kLanes; ++j) {
        s[j] += fin[b + j] ? v[b + j] : A(0);
        c[j] += fin[b + j];
      }
    A st = 0;
    int32_t ct = 0;
    for (int j = 0; j < kLanes; ++j) { st += s[j]; ct += c[j]; }
    if (ct > 0) {
      const A K = st / static_cast<A>(ct);
      A c1[kLanes] = {}, c2[kLanes] = {}, bmn[kLanes], bmx[kLanes];
      for (int j = 0; j < kLanes; ++j) {
        bmn[j] = std::numeric_limits<A>::infinity();
        bmx[j] = -std::numeric_limits<A>::infinity();
      }
      for (int b = 0; b < kBlock; b += kLanes)
        for (int j = 0; j < kLanes; ++j) {
          const A d = fin[b + j] ? v[b + j] - K : A(0);
          c1[j] += d;
          c2[j] += d * d;
          bmn[j] = fin[b + j] && v[b + j] < bmn[j] ? v[b + j] : bmn[j];
          bmx[j] = fin[b + j] && v[b + j] > bmx[j] ? v[b + j] : bmx[j];
        }
      double s1 = 0, s2 = 0;
      A lo = bmn[0], hi = bmx[0];
      for (int j = 0; j < kLanes; ++j) {
        s1 += c1[j];
        s2 += c2[j];
        mn[j] = bmn[j] < mn[j] ? bmn[j] : mn[j];
        mx[j] = bmx[j] > mx[j] ? bmx[j] : mx[j];
        lo = bmn[j] < lo ? bmn[j] : lo;
        hi = bmx[j] > hi ? bmx[j] : hi;
      }
      if (std::is_same_v<A, float> && squares_underflowed(s2, hi > lo)) {
        std::fill(c1, c1 + kLanes, A(0));
        std::fill(c2, c2 + kLanes, A(0));
        for (int b = 0; b < kBlock; b += kLanes)
          for (int j = 0; j < kLanes; ++j) {
            const A d = fin[b + j] ? (v[b + j] - K) * static_cast<A>(kTinyScale) : A(0);
            c1[j] += d;
            c2[j] += d * d;
          }
        s1 = s2 = 0;
        for (int j = 0; j < kLanes; ++j) {
          s1 += c1[j];
          s2 += c2[j];
        }
        s1 *= kTinyUnscale;
        s2 *= kTinyUnscale * kTinyUnscale;
      }
      Partial bp;
      shifted_to_partial(bp, ct, K, s1, s2);
      if (partial_overflowed(bp)) {
        if constexpr (std::is_same_v<T, double>) {
          fp64_scaled_partial(v, m, bp);  // float64 squares can overflow too
        } else {
          double Kd, d1, d2;
          fp64_shifted_sums(v, m, Kd, d1, d2);
          shifted_to_partial(bp, ct, Kd, d1, d2);
        }
      }
      chan_merge(res.moments.n, res.moments.mean, res.moments.m2, bp.n, bp.mean, bp.m2);
    }
    const Predicates<PredScalar> preds(p);
    for (int b = 0; b < kBlock; b += kLanes)
      for (int j = 0; j < kLanes; ++j) ctr[j].observe(preds, bin_value(v[b + j]), b + j < m);
    // Slots: computed branch-free for the whole block (vectorisable), then counted.
    int32_t ls[kBlock], gs[kBlock], fsl[kBlock];
    const int nb = p.nbins;
    const int lin_n = static_cast<int>(lin_slots(nb));
    for (int i = 0; i < kBlock; ++i) {
      const float f = bin_value(v[i]);
      const int nonfinite = f != f ? nb + 2 : (f > 0 ? nb + 3 : nb + 4);
      ls[i] = kLin ? (fin[i] ? lin_slot_finite(f, p.lo, p.inv_w, nb) : nonfinite) : (fin[i] ? -1 : nonfinite);
      if (kLog) gs[i] = lin_n + (fin[i] ? log_slot(f) : kLogSlots);
      if (kFloat) fsl[i] = fin[i] ? float_slot(v[i]) : kFloatDummy;  // float64: its exact magnitude
    }
    for (int i = 0; i < m; ++i) {
      uint32_t* hi = h + (i % kSubHists) * stride;
      if (kLin || !fin[i]) ++hi[ls[i]];
      if (kLog) ++hi[gs[i]];
      if (kFloat) ++fh[fsl[i] * kSubHists + i % kSubHists];
    }
  }
};

// One chunk: the vector kernel over its full blocks where it applies, the portable kernel for the rest.
template <typename T, bool kLin, bool kLog, bool kFloat>
void run_chunk(const ChunkKernel<T, kLin, kLog, kFloat>& kernel, Kernel vec, const T* x, int64_t n, ChunkResult& res,
               uint32_t* h, FloatCount* fh) {
  int64_t done = 0;
  if constexpr (!std::is_same_v<T, double>) {
    if (vec != Kernel::kPortable) {
      int64_t nonfin[3] = {0, 0, 0};  // NaN, +Inf, -Inf: the linear slots count them when kLin is off
      if (!kLin && !kLog && vec == Kernel::kAvx512)
        done = avx512::run_one_pass<T, kFloat, kSubHists>(x, n, kernel.p, res.moments, res.counters, fh, nonfin);
      else
        done = avx2::run_blocks<T, kLin, kLog, kFloat, kSubHists>(x, n, kernel.p, res.moments, res.counters, h,
                                                                   kernel.stride, fh, nonfin);
      const int nb = kernel.p.nbins;
      for (int k = 0; k < 3; ++k) h[nb + 2 + k] += static_cast<uint32_t>(nonfin[k]);
    }
  }
  if (done < n) kernel.run(x + done, n - done, res, h, fh);
}

template <typename T, bool kLin, bool kLog, bool kFloat>
void accumulate_flat(const T* x, int64_t n, const Params& p, double* fs, int64_t* is) {
  constexpr int64_t align = avx2::kBlock;  // chunks hold whole AVX2 blocks: only the tensor's end is left over
  const int64_t chunk = std::max(kMinChunk, (n + kMaxChunks - 1) / kMaxChunks + align - 1) / align * align;
  const int64_t nchunks = (n + chunk - 1) / chunk;
  ChunkResult one;  // a small tensor's one chunk: no heap allocation
  std::vector<ChunkResult> many(nchunks > 1 ? nchunks : 0);
  ChunkResult* parts = nchunks > 1 ? many.data() : &one;
  const int stride = hist_stride(p.nbins);
  // the private histograms count in the kernels' numbering; istate keeps the window the flags measure
  const int first = static_cast<int>(kept_first(p.nbins, p.layout));
  const int kept = static_cast<int>(float_base(p.nbins, p.layout) - kLinBase);
  const ChunkKernel<T, kLin, kLog, kFloat> kernel{p, stride};
  const Kernel vec = kernel_in_use();
  // The private histograms' slots a call touches: the window istate keeps, and the log2 dummy slot (non-finite
  // values) after it; zeroed per call, and by each flush.
  const int touched = kept + (kLog ? 1 : 0);
  at::parallel_for(0, nchunks, 1, [&](int64_t begin, int64_t end) {
    alignas(64) uint32_t h[kSubHists * kMaxHistStride];
    FloatCount* fh = kFloat ? float_hist_of_thread() : nullptr;
    for (int k = 0; k < kSubHists; ++k) std::fill(h + k * stride + first, h + k * stride + first + touched, 0u);
    FloatRange range;  // of the float buckets counted since the last flush
    auto flush = [&] {
      flush_hist(h + first, stride, kept, is + kLinBase);
      if (kFloat) flush_float(fh, is + float_base(p.nbins, p.layout), range);
      range = FloatRange();
    };
    // Chunks are run in pieces that end where a flush may come: fixed by n alone (so are the moments).
    const int64_t limit = kFloat ? kFloatFlushEvery : kFlushEvery;
    int64_t counted = 0;  // values in the private histograms
    for (int64_t c = begin; c < end; ++c) {
      const int64_t off = c * chunk, len = std::min(chunk, n - off);
      for (int64_t done = 0, piece; done < len; done += piece) {
        piece = std::min(limit, len - done);
        if (counted + piece > limit) {
          flush();
          counted = 0;
        }
        run_chunk(kernel, vec, x + off + done, piece, parts[c], h, fh);
        if (kFloat) {
          if (piece <= kFloatRangeMax) {
            const FloatRange r = float_range(x + off + done, piece, vec != Kernel::kPortable);
            range.widen(r.lo, r.hi);
          } else {
            range.widen(0, kFloatHalf - 1);
          }
        }
        counted += piece;
      }
    }
    flush();
  });
  Partial total;
  CounterTotals counters;
  for (int64_t c = 0; c < nchunks; ++c) {  // chunk order: deterministic for any thread count
    const ChunkResult& r = parts[c];
    merge_partial(total, r.moments);
    counters.merge(r.counters);
  }
  merge_into_state(fs, total);
  is[kCount] += n;
  counters.add_to(is + op_slot(0));
}

template <typename T, bool kFloat>
void accumulate_hists(const T* x, int64_t n, const Params& p, double* fs, int64_t* is) {
  const bool lin = p.flags & kLinearHist, lg = p.flags & kLogHist;
  if (lin && lg) accumulate_flat<T, true, true, kFloat>(x, n, p, fs, is);
  else if (lin) accumulate_flat<T, true, false, kFloat>(x, n, p, fs, is);
  else if (lg) accumulate_flat<T, false, true, kFloat>(x, n, p, fs, is);
  else accumulate_flat<T, false, false, kFloat>(x, n, p, fs, is);
}

template <typename T>
void accumulate_typed(const T* x, int64_t n, const Params& p, double* fs, int64_t* is) {
  if (p.flags & kFloatHist) accumulate_hists<T, true>(x, n, p, fs, is);
  else accumulate_hists<T, false>(x, n, p, fs, is);
}

}  // namespace cpu
}  // namespace hookstats
