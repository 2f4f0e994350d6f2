// accumulate_kernel.cuh -- the CUDA kernels of hookstats (one read pass, every statistic), with no ATen.
// Compiled by nvcc (accumulate_launch.cu) and, unchanged, as C++ on CPU threads by the emulation tests
// (tests/cuda_emu/cuda_emu.h defines HS_CPU_EMULATION and the CUDA built-ins this file uses).
#pragma once
#include <cuda/atomic>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../accumulator.h"
#include "../counter_predicates.h"
#include "kernel_plan.h"

#if defined(HS_CPU_EMULATION)
#define HS_SHARED(T, name) T& name = ::cuda_emu::block_shared<T>()
#define HS_DYN_SMEM(T, name) T* name = static_cast<T*>(::cuda_emu::dynamic_smem())
#define HS_LDG16(p) (*(p))
#else
#define HS_SHARED(T, name) __shared__ T name
#define HS_DYN_SMEM(T, name) extern __shared__ T name[]
#define HS_LDG16(p) __ldg(p)
#endif

// Planted bugs for the emulation tests (tests/test_cuda_emulation.py), never defined in a real build.
#if defined(HS_BUG_RELAXED_TICKET)
#define HS_TICKET_ORDER cuda::memory_order_relaxed
#else
#define HS_TICKET_ORDER cuda::memory_order_acq_rel
#endif

namespace hookstats {
namespace cuda_kernel {

// ---- element logic ----
template <typename T> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };

template <typename T> HS_HD typename Acc<T>::type to_acc(T v) { return static_cast<typename Acc<T>::type>(v); }
template <> HS_HD float to_acc<__half>(__half v) { return __half2float(v); }
template <> HS_HD float to_acc<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

// The values of one 16-byte vector, in memory order. bf16 is float32's top half: a shift or a mask each
// (the generic conversion takes two instructions for the upper value of a pair).
template <typename T>
HS_HD void unpack(const uint4& r, typename Acc<T>::type* v) {
  constexpr int V = 16 / sizeof(T);
  T e[V];
  memcpy(e, &r, 16);
#pragma unroll
  for (int k = 0; k < V; ++k) v[k] = to_acc(e[k]);
}
template <>
HS_HD void unpack<__nv_bfloat16>(const uint4& r, float* v) {
  const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t lo = w[k] << 16, hi = w[k] & 0xffff0000u;
    memcpy(&v[2 * k], &lo, 4);
    memcpy(&v[2 * k + 1], &hi, 4);
  }
}

HS_HD bool finite_acc(float v) { return __builtin_fabsf(v) < __builtin_huge_valf(); }
HS_HD bool finite_acc(double v) { return __builtin_fabs(v) < __builtin_huge_val(); }
HS_HD float min_acc(float a, float b) { return fminf(a, b); }  // IEEE minNum: NaN (empty) is ignored
HS_HD float max_acc(float a, float b) { return fmaxf(a, b); }
HS_HD double min_acc(double a, double b) { return fmin(a, b); }
HS_HD double max_acc(double a, double b) { return fmax(a, b); }
HS_HD float nan_acc(float) { return __builtin_nanf(""); }
HS_HD double nan_acc(double) { return __builtin_nan(""); }

// lin_slot_finite (accumulator.h) with the same exact steps in fewer GPU instructions: minNum/maxNum
// clamps and a float->int conversion that rounds down (F2I.FLOOR). t is NaN only for a NaN v, whose slot
// (0 on both) slow_chunk undoes.
HS_HD int lin_slot_fast(float v, const Params& p) {
#if defined(__CUDA_ARCH__)
  const float t = fminf(fmaxf((v - p.lo) * p.inv_w, -1.0f), static_cast<float>(p.nbins));
  return 1 + __float2int_rd(t);
#else
  return lin_slot_finite(v, p.lo, p.inv_w, p.nbins);
#endif
}

// Shared-memory counter: ATOMS.POPC.INC on the GPU (lanes hitting one slot are combined). shared_dec undoes an
// increment (u32 wrap-around adds -1).
__device__ __forceinline__ void shared_inc(unsigned* p) { atomicAdd(p, 1u); }
__device__ __forceinline__ void shared_dec(unsigned* p) { atomicAdd(p, ~0u); }

// Which histograms a kernel updates: compile-time constants in the dense kernels, runtime in the strided one.
struct Hists {
  bool lin, lg, flt;
};
HS_HD Hists hists_of(const Params& p) {
  return Hists{(p.flags & kLinearHist) != 0, (p.flags & kLogHist) != 0, (p.flags & kFloatHist) != 0};
}

// The block's shared histograms (dynamic shared memory, see dyn_smem_bytes): float buckets at offset 0, then
// one linear | log2 histogram per warp. Indexed from the array itself, not from pointers kept in registers.
__device__ __forceinline__ unsigned* float_hist() {
  HS_DYN_SMEM(unsigned, smem);
  return smem;
}
__device__ __forceinline__ unsigned* warp_hist(const Params& p) {
  return float_hist() + float_words(p) + (threadIdx.x / kWarp) * hist_stride(p);
}

// Per-thread running state: integer counts plus fp64 sums shifted by K (this thread's first chunk mean).
// N: the count's type, float64 or (where its registers would spill otherwise: bf16 with float buckets) u32, exact as a
// block sees < 2^31 values (max_block_elems).
template <typename A, typename N = double>
struct ThreadStats {
  N n = 0;
  double K = 0, s1 = 0, s2 = 0;
  A mn, mx;
  Counts<ThreadLanes> ctr;  // the op counters (counter_predicates.h)
  bool huge = false;  // float64 only: K, s1, s2 are of the values times kHugeScale (accumulator.h kHuge)
};

template <int M, typename A>
struct Chunk {
  A v[M];
};
// A chunk's moments: count of finite values, fp64 shift and shifted sums, finite min/max.
template <typename A>
struct ChunkMoments {
  double k, e1, e2;
  A mn, mx;
  int c;
  bool huge;  // k, e1, e2 are of the values times kHugeScale
};

// Whether a chunk's fp32 squares can underflow: only for inputs with fp32's exponent range. fp16 values
// (nonzero |v| >= 2^-24) keep every fp32 square normal; fp64 is summed in fp64.
template <typename T>
constexpr bool kUnderflowCheck = std::is_same_v<T, float> || std::is_same_v<T, __nv_bfloat16>;

// Where float bucket `slot` lives in the block's shared table. The slots' own order by default: the bank is 2 exponent
// and 3 mantissa bits, so +v and -v share one (tests/bank_conflicts.py simulates it: 2.51-way on average on N(0,1)).
// -DHS_BANK_SWIZZLE=1 XORs the slot's top 5 bits (sign, exponent bits 4-7) into the bank: 2.44-way, for one more
// SASS instruction a value. Off, as the kernel is issue-bound and the H200 profile showed no shared-memory stall
// among its top three (long scoreboard, not selected, math pipe throttle): `bash benchmarks/gpu_tune.sh "base="
// "swizzle=-DHS_BANK_SWIZZLE=1"` measures the two side by side. Either way an involution: the flush reads slot s
// from word float_word(s); istate keeps the slots' own order.
#if !defined(HS_BANK_SWIZZLE)
#define HS_BANK_SWIZZLE 0
#endif
constexpr int kBankSwizzleShift = 7;
HS_HD int float_word(int slot) { return HS_BANK_SWIZZLE ? slot ^ (slot >> kBankSwizzleShift) : slot; }

// Zeros in their natural bucket: the dense fp16 kernels count +0 in slot 0's word and -0 in slot 2048's, which no
// other fp16 value reaches (the least nonzero one, 2^-24, is far above 2^-129), and the block moves them to
// kFloatZero's word before its flush (move_zeros): two instructions a value fewer (the test for +-0 and its select).
// bf16 has nonzero values in those buckets (kTinyInZeroSlots: |v| in [2^-133, 2^-129), 0 < (bits & 0x7fff) < 16): on
// sm_90 (and in the emulation) its dense kernels count zeros there too, and count those tiny values apart
// (BlockShared::tiny) for move_zeros to leave in place: the scalar head and tail as they go, the vectors by a second
// read of the thread's own vectors, only where a running 16x2 minimum over them (PairStats::tiny: one mask and one
// VIADDMNMX a pair) saw one. sm_80 lacks the 16x2 add-minimum in one instruction: there bf16 keeps the test for +-0.
#if !defined(HS_BF16_ZEROS_NATURAL)
#if defined(HS_CPU_EMULATION) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900)
#define HS_BF16_ZEROS_NATURAL 1
#else
#define HS_BF16_ZEROS_NATURAL 0
#endif
#endif
template <typename T>
constexpr bool kTinyInZeroSlots = std::is_same_v<T, __nv_bfloat16> && HS_BF16_ZEROS_NATURAL;
template <typename T>
constexpr bool kZerosNatural = std::is_same_v<T, __half> || kTinyInZeroSlots<T>;

// A bf16 word's magnitudes less one per half, its nonzero values below 2^-129 then < 15 (zeros wrap to 0xffff):
// kTinyInZeroSlots' running minimum, min(a + b, c) per 16-bit half.
HS_HD uint32_t add_min_u16x2(uint32_t a, uint32_t b, uint32_t c) {
#if defined(__CUDA_ARCH__)
  return __viaddmin_u16x2(a, b, c);
#else
  uint32_t r = 0;
  for (int sh = 0; sh < 32; sh += 16) {
    const uint32_t x = ((a >> sh) + (b >> sh)) & 0xffffu, y = (c >> sh) & 0xffffu;
    r |= (x < y ? x : y) << sh;
  }
  return r;
#endif
}
constexpr uint32_t kTinyBelow = 15;  // a half of the running minimum below this: a tiny value was seen
HS_HD bool tiny_seen(uint32_t run) { return (run & 0xffffu) < kTinyBelow || (run >> 16) < kTinyBelow; }
// Whether a bf16 value (its 16 bits) is tiny: nonzero and in slot 0 or 2048.
HS_HD bool tiny_bf16(uint32_t bits) { return (bits & 0x7fffu) - 1u < kTinyBelow; }

// The byte offset of a value's float bucket in the shared table (non-finite values too: the slow path undoes those);
// kNatural: zeros in slot 0 or 2048 (kZerosNatural), as for any other value.
template <bool kNatural = false>
HS_HD unsigned float_offset(float v) {
  // 4 x float_word(float_slot(v)) from the value's bits: two shifts and one masked XOR (LOP3) where the plain slot
  // took a shift and an address computation (LEA); zero's select comes after. An opaque copy of the bits keeps the
  // compiler from re-deriving a bf16 value's bits from its load word (a shift and a mask, where one shift does).
#if defined(__CUDA_ARCH__)
  asm("mov.b32 %0, %1;" : "=f"(v) : "f"(v));
#endif
  const uint32_t u = float_bits(v);
  const unsigned swizzle = HS_BANK_SWIZZLE ? u >> (kFloatShift + kBankSwizzleShift - 2) : 0u;
  const unsigned natural = ((u >> (kFloatShift - 2)) ^ swizzle) & ((kFloatSlots - 1u) << 2);
  if constexpr (kNatural) return natural;
  return (u & 0x7fffffffu) == 0 ? float_word(kFloatZero) * 4u : natural;
}
template <bool kNatural = false>
HS_HD unsigned float_offset(double v) { return float_word(float_slot(v)) * 4u; }
// The shared counter at a byte offset of the float table.
__device__ __forceinline__ unsigned* float_counter(unsigned offset) {
  return reinterpret_cast<unsigned*>(reinterpret_cast<unsigned char*>(float_hist()) + offset);
}

// Folds one chunk's moments into t (the first sets K).
template <typename A, typename N>
__device__ __forceinline__ void fold_chunk(ThreadStats<A, N>& t, const ChunkMoments<A>& m) {
  if (t.n == 0) t.K = m.k;
  const double dc = static_cast<double>(m.c), delta = m.k - t.K;
  t.s1 += m.e1 + dc * delta;
  t.s2 += m.e2 + delta * (2.0 * m.e1 + dc * delta);
  t.n += static_cast<N>(m.c);
}

// The rare chunk, out of line (inlined, the compiler predicates it into every chunk: +9 SASS instructions per
// element): non-finite values, fp32 sums that overflowed (|v - K| past ~1.8e19) or squares that underflowed.
// Moments of the finite values in fp64 (accumulator.h fp64_shifted_sums); each non-finite value leaves the
// slots the fast path gave it (linear, float buckets) for its own linear slot (NaN, +Inf, -Inf).
// float64: the moments of the values times kHugeScale where the thread is huge already or the chunk has a finite
// |v| >= kHuge (r.huge).
template <int M, typename A>
__device__ __forceinline__ ChunkMoments<A> redo_chunk(const Chunk<M, A>& ch, const Params& p, bool huge) {
  ChunkMoments<A> r;
  if constexpr (std::is_same_v<A, double>) {
    for (int i = 0; i < M; ++i) huge = huge || (finite_acc(ch.v[i]) && !(fabs(ch.v[i]) < kHuge));
  }
  r.huge = huge;
  fp64_shifted_sums(ch.v, M, r.k, r.e1, r.e2, huge ? kHugeScale : 1.0);
  r.mn = r.mx = nan_acc(A(0));
  r.c = 0;
  const Hists h = hists_of(p);
  unsigned* warp = warp_hist(p);
  for (int i = 0; i < M; ++i) {
    const A v = ch.v[i];
    if (finite_acc(v)) {
      r.mn = min_acc(r.mn, v);
      r.mx = max_acc(r.mx, v);
      ++r.c;
      continue;
    }
    const float f = bin_value(v);
    if (h.lin) shared_dec(&warp[lin_slot_fast(f, p)]);
    if (h.flt) shared_dec(float_counter(float_offset(v)));  // never a zero: the same word in either numbering
    shared_inc(&warp[f != f ? p.nbins + 2 : (f > 0.0f ? p.nbins + 3 : p.nbins + 4)]);
  }
  return r;
}
template <int M, typename A>
__device__ __noinline__ ChunkMoments<A> slow_chunk(Chunk<M, A> ch, Params p, bool huge) {
  return redo_chunk(ch, p, huge);
}
// 16-bit values: a chunk as its load words (half the argument registers of its values: one call per chunk, where
// the values would spill), redone kSlowPart values at a time and merged about the first part's shift.
constexpr int kSlowPart = 8;
template <int K>
struct Words {
  uint32_t w[K];
};
template <typename T, int K>
__device__ __noinline__ ChunkMoments<float> slow_words(Words<K> ch, Params p) {
  ThreadStats<float> acc;
  acc.mn = acc.mx = nan_acc(0.0f);
  for (int g = 0; g < 2 * K; g += kSlowPart) {
    Chunk<kSlowPart, float> part;
#pragma unroll
    for (int k = 0; k < kSlowPart / 2; ++k) {
      T e[2];
      memcpy(e, &ch.w[g / 2 + k], 4);
      part.v[2 * k] = to_acc(e[0]);
      part.v[2 * k + 1] = to_acc(e[1]);
    }
    const ChunkMoments<float> m = redo_chunk(part, p, false);
    fold_chunk(acc, m);
    acc.mn = fminf(acc.mn, m.mn);
    acc.mx = fmaxf(acc.mx, m.mx);
  }
  return ChunkMoments<float>{acc.K, acc.s1, acc.s2, acc.mn, acc.mx, static_cast<int>(acc.n), false};
}


// Whether a chunk's fast-path moments stand: else slow_chunk redoes them (non-finite values, fp32 overflow,
// underflowed squares; float64: a finite |v| >= kHuge may be there, or the thread is huge already). cmx > cmn is false
// for a chunk of equal values (Kc is that value: exact sums, never redone).
template <bool kUnderflow, typename A, typename N>
__device__ __forceinline__ bool fast_path_stands(const ThreadStats<A, N>& t, A c2, A cmn, A cmx) {
  bool maybe_huge = false;  // float64 (NaN/Inf chunks go slow_chunk anyway)
  if constexpr (std::is_same_v<A, double>) maybe_huge = t.huge || !(fmax(fabs(cmn), fabs(cmx)) < kHuge);
  return finite_acc(c2) && !maybe_huge && !(kUnderflow && squares_underflowed(c2, cmx > cmn));
}

// The thread's first huge value (slow_chunk's m.huge): its sums so far scaled (exact, or negligibly small).
template <typename A, typename N>
__device__ __forceinline__ void scale_if_huge(ThreadStats<A, N>& t, const ChunkMoments<A>& m) {
  if (m.huge && !t.huge) {
    t.huge = true;
    t.K *= kHugeScale;
    t.s1 *= kHugeScale;
    t.s2 = t.s2 * kHugeScale * kHugeScale;
  }
}

// The fast path's moments folded into t where they stand (the caller folds its min/max then: true), else redo()
// folds slow_chunk's and their min/max (false).
template <int M, bool kUnderflow, typename A, typename N, typename Redo>
__device__ __forceinline__ bool fold_moments(ThreadStats<A, N>& t, A Kc, A c1, A c2, A cmn, A cmx, Redo redo) {
  if (fast_path_stands<kUnderflow>(t, c2, cmn, cmx)) {
    fold_chunk(t, ChunkMoments<A>{static_cast<double>(Kc), static_cast<double>(c1), static_cast<double>(c2), cmn,
                                  cmx, M, false});
    return true;
  }
  redo();
  return false;
}

// The chunk's shift: its midrange, between its least and greatest value (so fp32 never sums far-off values), two
// instructions where its mean took M. A non-finite min or max makes it, hence c2, non-finite: slow_chunk.
template <typename A>
HS_HD A midrange(A mn, A mx) {
  return A(0.5) * mn + A(0.5) * mx;
}

// The shifted sums of a chunk about Kc.
template <int M, typename A>
__device__ __forceinline__ void shifted_sums(const A (&v)[M], A Kc, A& c1, A& c2) {
  c1 = v[0] - Kc;
  c2 = c1 * c1;
#pragma unroll
  for (int i = 1; i < M; ++i) {
    const A d = v[i] - Kc;
    c1 += d;
    c2 += d * d;
  }
}

// The histograms' shared counters for one value (the float buckets from the value's own bits; kNatural: zeros in
// their natural word, kZerosNatural).
template <bool kNatural = false, typename A>
__device__ __forceinline__ void count_value(A x, const Params& p, Hists h, unsigned* warp) {
  const float f = bin_value(x);
  if (h.lin) shared_inc(&warp[lin_slot_fast(f, p)]);
  if (h.lg) shared_inc(&warp[lin_slots(p.nbins) + log_slot(f)]);  // exponent 255 (NaN, Inf): the dummy slot
  if (h.flt) shared_inc(float_counter(float_offset<kNatural>(x)));
}

// Consumes M values (M a power of two) as one chunk. Fast path, branch-free, as if every value were finite:
// integer statistics per value; moments in the input precision about the chunk's midrange Kc, then folded into
// fp64 sums about K. A non-finite value makes the chunk's sum of squares non-finite, so the one test on c2 sends it
// (and fp32 overflow, and underflowed squares) to slow_chunk (fast_path_stands).
// hists false (a kSkipHist call, uniform over the launch; p then has no histogram flags): the dense kernels
// (kSkippable) skip the histograms with one branch per chunk. The strided kernel counts them beside the moments, as
// its p says (a separate pass there made ptxas spill the float64 kernel).
// kDefer: a chunk whose fast path does not stand returns false with its integer statistics counted and nothing else
// folded (redo_consumed finishes it), so that no call sits in the caller's loop; else true.
template <int M, bool kUnderflow, bool kSkippable, typename A, bool kNatural = false, bool kDefer = false,
          typename N = double>
__device__ __forceinline__ bool consume(ThreadStats<A, N>& t, const A (&v)[M], const Params& p, Hists h,
                                       unsigned* warp, bool hists) {
  const Predicates<PredOne> preds(p);
  A cmn = nan_acc(A(0)), cmx = cmn;
#pragma unroll
  for (int i = 0; i < M; ++i) {
    cmn = min_acc(cmn, v[i]);
    cmx = max_acc(cmx, v[i]);
    t.ctr.observe(preds, bin_value(v[i]));
    if constexpr (!kSkippable) count_value<kNatural>(v[i], p, h, warp);
  }
  const A Kc = midrange(cmn, cmx);
  A c1, c2;
  shifted_sums(v, Kc, c1, c2);
  if constexpr (kSkippable) {
    if ((h.lin || h.lg || h.flt) && hists) {
#pragma unroll
      for (int i = 0; i < M; ++i) count_value<kNatural>(v[i], p, h, warp);
    }
  }
  // one fold for either path (fold_moments' two, as consume_pairs has them, made the fp32 kernels with the linear
  // or log2 histograms spill on sm_80)
  ChunkMoments<A> m{static_cast<double>(Kc), static_cast<double>(c1), static_cast<double>(c2), cmn, cmx, M, false};
  if (!fast_path_stands<kUnderflow>(t, c2, cmn, cmx)) {
    if constexpr (kDefer) {
      return false;
    } else {
      Chunk<M, A> ch;
#pragma unroll
      for (int i = 0; i < M; ++i) ch.v[i] = v[i];
      m = slow_chunk(ch, p, t.huge);
      scale_if_huge(t, m);
    }
  }
  t.mn = min_acc(t.mn, m.mn);
  t.mx = max_acc(t.mx, m.mx);
  fold_chunk(t, m);
  return true;
}

// The rest of a chunk that consume<..., kDefer = true> returned false for: its moments and min/max redone (inline: its
// caller runs it outside the hot loop, where a call would hold the loop's state in the callee-saved registers).
template <int M, typename A, typename N>
__device__ __forceinline__ void redo_consumed(ThreadStats<A, N>& t, const A (&v)[M], const Params& p) {
  Chunk<M, A> ch;
#pragma unroll
  for (int i = 0; i < M; ++i) ch.v[i] = v[i];
  const ChunkMoments<A> m = redo_chunk(ch, p, t.huge);
  scale_if_huge(t, m);
  t.mn = min_acc(t.mn, m.mn);
  t.mx = max_acc(t.mx, m.mx);
  fold_chunk(t, m);
}

// 16-bit inputs (bf16, fp16) two values to a 32-bit word: min/max and the near-zero test take one packed instruction
// per pair (HMNMX2, HSET2) where the unpacked values take one each.
template <typename T> struct PairOf;
template <> struct PairOf<__nv_bfloat16> {
  using type = __nv_bfloat162;
  static HS_HD type both(float x) { return __float2bfloat162_rn(x); }  // exact for a value of the type, or NaN
};
template <> struct PairOf<__half> {
  using type = __half2;
  static HS_HD type both(float x) { return __float2half2_rn(x); }
};
template <typename T> constexpr bool kPaired = std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>;

// A thread's packed running min/max (NaN: empty, as minNum ignores it), folded into ThreadStats at the end.
template <typename T>
struct PairStats {
  using P = typename PairOf<T>::type;
  P mn, mx;
  Predicates<PairPredicates<T>::template of> preds;  // the op counters' (counter_predicates.h)
  uint32_t tiny = 0xffffffffu;  // kTinyInZeroSlots: the running minimum of add_min_u16x2 over the words counted
  HS_HD explicit PairStats(const Params& p) : preds(p) { mn = mx = PairOf<T>::both(__builtin_nanf("")); }
  // t's min/max (the scalar head's) taken over, so that t's are dead in the main loop (fewer live registers).
  template <typename N>
  HS_HD void take_from(ThreadStats<float, N>& t) {
    mn = __hmin2(mn, PairOf<T>::both(t.mn));
    mx = __hmax2(mx, PairOf<T>::both(t.mx));
    t.mn = t.mx = __builtin_nanf("");
  }
  template <typename N>
  HS_HD void fold_into(ThreadStats<float, N>& t) const {
    t.mn = fminf(t.mn, fminf(__low2float(mn), __high2float(mn)));
    t.mx = fmaxf(t.mx, fmaxf(__low2float(mx), __high2float(mx)));
  }
};

template <typename P>
HS_HD P pair_of(uint32_t w) {
  P r;
  memcpy(&r, &w, 4);
  return r;
}

// consume for 16-bit values: w holds v's M values as M / 2 words (v[2k] the low half of w[k]).
template <int M, bool kUnderflow, typename T, typename N>
__device__ __forceinline__ void consume_pairs(ThreadStats<float, N>& t, PairStats<T>& ps, const uint32_t (&w)[M / 2],
                                              const float (&v)[M], const Params& p, Hists h, unsigned* warp,
                                              bool hists) {
  using P = typename PairOf<T>::type;
  P pmn = pair_of<P>(w[0]), pmx = pmn;
  Counts<PairLanes<P>> c;  // the chunk's op counters, per half
#pragma unroll
  for (int k = 0; k < M / 2; ++k) {
    const P x = pair_of<P>(w[k]);
    if (k > 0) {
      pmn = __hmin2(pmn, x);
      pmx = __hmax2(pmx, x);
      c.observe(ps.preds, x);
    } else {
      c.observe_first(ps.preds, x);
    }
  }
  c.add_to(t.ctr.acc);
  const float cmn = fminf(__low2float(pmn), __high2float(pmn)), cmx = fmaxf(__low2float(pmx), __high2float(pmx));
  const float Kc = midrange(cmn, cmx);
  float c1, c2;
  shifted_sums(v, Kc, c1, c2);
  if ((h.lin || h.lg || h.flt) && hists) {
#pragma unroll
    for (int i = 0; i < M; ++i) count_value<kZerosNatural<T>>(v[i], p, h, warp);
    if constexpr (kTinyInZeroSlots<T>) {
      if (h.flt) {
#pragma unroll
        for (int k = 0; k < M / 2; ++k) ps.tiny = add_min_u16x2(w[k] & 0x7fff7fffu, 0xffffffffu, ps.tiny);
      }
    }
  }
  const auto redo = [&] {
    Words<M / 2> ch;
#pragma unroll
    for (int k = 0; k < M / 2; ++k) ch.w[k] = w[k];
    const ChunkMoments<float> m = slow_words<T>(ch, p);
    fold_chunk(t, m);
    ps.mn = __hmin2(ps.mn, PairOf<T>::both(m.mn));
    ps.mx = __hmax2(ps.mx, PairOf<T>::both(m.mx));
  };
  if (fold_moments<M, kUnderflow>(t, Kc, c1, c2, cmn, cmx, redo)) {
    ps.mn = __hmin2(ps.mn, pmn);
    ps.mx = __hmax2(ps.mx, pmx);
  }
}

// ---- reductions ----
HS_HD BlockPartial empty_partial() { return BlockPartial{Sums{0, 0, 0, 0}, __builtin_nan(""), __builtin_nan("")}; }
HS_HD void merge_block_partial(BlockPartial& a, const BlockPartial& b) {
  merge_sums(a.s, b.s);
  a.mn = fmin_nan(a.mn, b.mn);
  a.mx = fmax_nan(a.mx, b.mx);
}

// A warp's or block's op counters (counters.h): exact in 32 bits, as a block sees < 2^31 values (max_block_elems).
using BlockCounts = Counts<Tally<unsigned>>;

__device__ __forceinline__ void warp_merge(BlockPartial& a, BlockCounts& c) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) {  // tree in lane order: the same result on every run
    Sums b;
    b.n = __shfl_down_sync(0xffffffffu, a.s.n, o);
    b.K = __shfl_down_sync(0xffffffffu, a.s.K, o);
    b.s1 = __shfl_down_sync(0xffffffffu, a.s.s1, o);
    b.s2 = __shfl_down_sync(0xffffffffu, a.s.s2, o);
    if (lane + o < kWarp) merge_sums(a.s, b);
  }
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) {
    const double mn = __shfl_down_sync(0xffffffffu, a.mn, o), mx = __shfl_down_sync(0xffffffffu, a.mx, o);
    BlockCounts z;
#pragma unroll
    for (int k = 0; k < kOpCounters; ++k) z.acc[k] = __shfl_down_sync(0xffffffffu, c.acc[k], o);
    if (lane + o < kWarp) {
      a.mn = fmin_nan(a.mn, mn);
      a.mx = fmax_nan(a.mx, mx);
      c.merge(z);
    }
  }
}

// Blocks first, first + step, ... of ws merged in that order (no division).
HS_HD BlockPartial merge_blocks(const BlockPartial* ws, int first, int nblk, int step) {
  BlockPartial g = empty_partial();
  for (int b = first; b < nblk; b += step) merge_block_partial(g, ws[b]);
  return g;
}

// ---- the rare overflow paths, out of line (a call, off the common path) ----
// Chan's merge of (n, mean, M2) over a warp, in lane order.
__device__ __forceinline__ void chan_warp_merge(Partial& a) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) {
    const double n = __shfl_down_sync(0xffffffffu, a.n, o), mean = __shfl_down_sync(0xffffffffu, a.mean, o),
                 m2 = __shfl_down_sync(0xffffffffu, a.m2, o);
    if (lane + o < kWarp) chan_merge(a.n, a.mean, a.m2, n, mean, m2);
  }
}
// A float64 block where a thread saw a finite |v| >= kHuge (its sums are of the values times kHugeScale, and
// scaled back they may pass DBL_MAX): each thread's (n, mean, M2) scaled back, Chan-merged over warps and the block;
// sm.part[0]'s sums become the block's (n, K = mean, S1 = 0, S2 = M2: exact), the other warps' empty (their
// min/max stay). Called by every thread of the block.
template <typename A, typename N>
__device__ __noinline__ void redo_block_sums(ThreadStats<A, N> t, BlockShared& sm) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, nwarps = blockDim.x / kWarp;
  Partial p;
  shifted_to_partial(p, static_cast<double>(t.n), t.K, t.s1, t.s2);
  if (t.huge) {  // an M2 past DBL_MAX is +inf
    p.mean *= kHugeUnscale;
    p.m2 = p.m2 * kHugeUnscale * kHugeUnscale;
  }
  chan_warp_merge(p);
  if (lane == 0) sm.part[warp].s = Sums{p.n, p.mean, 0.0, p.m2};
  __syncthreads();
  Partial b;
  if (warp == 0 && lane < nwarps) {
    b.n = sm.part[lane].s.n;
    b.mean = sm.part[lane].s.K;
    b.m2 = sm.part[lane].s.s2;
  }
  __syncthreads();
  if (warp == 0) chan_warp_merge(b);
  if (static_cast<int>(threadIdx.x) < nwarps) {
    sm.part[threadIdx.x].s = threadIdx.x == 0 ? Sums{b.n, b.mean, 0.0, b.m2} : Sums{0, 0, 0, 0};
  }
  __syncthreads();
}
// The grid's moments where its merged sums overflowed (means near +-DBL_MAX, an M2 past it): the blocks' own
// (n, mean, M2), Chan-merged in block order.
__device__ __noinline__ Partial chan_merge_blocks(const BlockPartial* ws, int nblk) {
  Partial g;
  for (int b = 0; b < nblk; ++b) {
    Partial q;
    shifted_to_partial(q, ws[b].s.n, ws[b].s.K, ws[b].s.s1, ws[b].s.s2);
    chan_merge(g.n, g.mean, g.m2, q.n, q.mean, q.m2);
  }
  return g;
}

// kZerosNatural: the zeros counted in slot 0's and slot 2048's words moved to kFloatZero's (tiny: the nonzero values
// counted there, + and -, which stay).
__device__ __forceinline__ void move_zeros(unsigned* fh, const unsigned* tiny) {
  unsigned &pos = fh[float_word(0)], &neg = fh[float_word(kFloatHalf)];
  fh[float_word(kFloatZero)] += (pos - tiny[0]) + (neg - tiny[1]);
  pos = tiny[0];
  neg = tiny[1];
}

// Zeroes the block's shared histograms; returns this thread's warp histogram.
__device__ __forceinline__ unsigned* zero_hists(const Params& p) {
  const int words = float_words(p) + (blockDim.x / kWarp) * hist_stride(p);
  unsigned* all = float_hist();
  for (int i = threadIdx.x; i < words; i += blockDim.x) all[i] = 0u;
#if !defined(HS_BUG_NO_SYNC)
  __syncthreads();
#endif
  return warp_hist(p);
}

// Adds the block's shared counters to istate: the warps' histograms summed per slot, the float buckets; only
// nonzero counts take a global atomic (exact, order-free).
__device__ __forceinline__ void flush_hists(const Target& tg, const Params& p) {
  const unsigned* hist_all = float_hist();
  const int nwarps = blockDim.x / kWarp, stride = hist_stride(p), fw = float_words(p);
  const int kept = static_cast<int>(kept_first(p.nbins, p.layout));  // istate keeps slots [kept, hist_used)
  for (int s = kept + threadIdx.x; s < hist_used(p); s += blockDim.x) {
    unsigned long long sum = 0;
    for (int w = 0; w < nwarps; ++w) sum += hist_all[fw + w * stride + s];
    if (sum) atomicAdd(&tg.is[kLinBase + s - kept], sum);
  }
  unsigned long long* fis = tg.is + float_base(p.nbins, p.layout);
  for (int s = threadIdx.x; s < fw; s += blockDim.x) {
    const unsigned c = hist_all[float_word(s)];
    if (c) atomicAdd(&fis[s], static_cast<unsigned long long>(c));
  }
}

// Thread -> warp -> block -> grid as shifted sums (merge_sums: no division), converted to (n, mean, M2) once, then
// Chan-merged into fstate: three float64 divisions on the way (tests/test_ptxas.py counts them in the SASS); the
// overflow cases redo with Chan's merges out of line. Integer statistics go to global atomics (exact, order-free);
// float moments: one block merges straight into fstate, else a last-block-done step merges the per-block partials
// in block order and re-arms the ticket, so nothing needs zeroing before the next launch.
template <typename A, typename N>
__device__ void finish_block(const ThreadStats<A, N>& t, const Target& tg, int bid, int nblk, const Params& prm,
                             BlockShared& sm) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, nwarps = blockDim.x / kWarp;
  BlockPartial b{Sums{static_cast<double>(t.n), t.K, t.s1, t.s2}, static_cast<double>(t.mn), static_cast<double>(t.mx)};
  BlockCounts c;
  t.ctr.add_to(c.acc);
  warp_merge(b, c);
  if (lane == 0) {
    sm.part[warp] = b;
#pragma unroll
    for (int k = 0; k < kOpCounters; ++k) sm.counts[k][warp] = c.acc[k];
  }
  if constexpr (std::is_same_v<A, double>) {
    // a thread's huge sums (values times kHugeScale) cannot join the others' shifted sums
    if (__syncthreads_or(t.huge)) redo_block_sums(t, sm);
  } else {
    __syncthreads();
  }
  BlockPartial* ws = reinterpret_cast<BlockPartial*>(tg.scratch + kTicketBytes);
  if (warp == 0) {
    b = empty_partial();
    c = BlockCounts();
    if (lane < nwarps) {
      b = sm.part[lane];
#pragma unroll
      for (int k = 0; k < kOpCounters; ++k) c.acc[k] = sm.counts[k][lane];
    }
    warp_merge(b, c);
    if (lane == 0) {
#pragma unroll
      for (int k = 0; k < kOpCounters; ++k) atomicAdd(&tg.is[op_slot(k)], static_cast<unsigned long long>(c.acc[k]));
      if (nblk == 1) {
        sm.part[0] = b;  // read back below: b held across the barrier makes ptxas spill
        sm.last = 1;
      } else {
        ws[bid] = b;
        cuda::atomic_ref<unsigned, cuda::thread_scope_device> ticket(*reinterpret_cast<unsigned*>(tg.scratch));
        sm.last = ticket.fetch_add(1u, HS_TICKET_ORDER) == static_cast<unsigned>(nblk - 1);
      }
    }
  }
  __syncthreads();
  // The histograms go out after the ticket: the last block's merge waits for no block's flush, its own included
  // (its warp 0 flushes after merging).
  if (!sm.last || warp != 0) {
    flush_hists(tg, prm);
    return;
  }
  if (nblk == 1) {
    b = sm.part[0];
  } else {
#if defined(__CUDA_ARCH__)
    // Lane 0 acquired the other blocks' partials; each reading lane also acquires at device scope, as the
    // barrier alone orders at block scope. (TSan does not model fences: the emulation relies on the barrier.)
    cuda::atomic_thread_fence(cuda::memory_order_acquire, cuda::thread_scope_device);
#endif
    // The last block: lane l merges blocks l, l+32, ... in order, then the lanes merge in lane order.
    b = merge_blocks(ws, lane, nblk, kWarp);
    BlockCounts unused;
    warp_merge(b, unused);
  }
  if (lane == 0) {
    // One block, or the last: the grid's sums converted once (one division) and Chan-merged into fstate.
    Partial g;
    shifted_to_partial(g, b.s.n, b.s.K, b.s.s1, b.s.s2);
    if (nblk > 1 && partial_overflowed(g)) g = chan_merge_blocks(ws, nblk);
    g.mn = b.mn;
    g.mx = b.mx;
    merge_into_state(tg.fs, g);
    atomicAdd(&tg.is[kCount], static_cast<unsigned long long>(tg.n));
    if (nblk > 1) {
      cuda::atomic_ref<unsigned, cuda::thread_scope_device>(*reinterpret_cast<unsigned*>(tg.scratch))
          .store(0u, cuda::memory_order_relaxed);
    }
  }
  flush_hists(tg, prm);
}

// The 1-element enabled flag (bool/uint8/int32/int64), read on the device, so no host sync: 0 off, else its low
// byte (little-endian: where kSkipHist is) with 0x100 set, as the CPU kernel reads it.
__device__ __forceinline__ int flag_value(const unsigned char* enabled, int bytes) {
  unsigned char any = 0;
  for (int k = 0; k < bytes; ++k) any |= enabled[k];
  return any ? (enabled[0] | 0x100) : 0;
}
// The Params of a call whose flag has kSkipHist: no histogram (the same state layout; its shared histograms shrink
// to the linear part, which keeps counting NaN/Inf). The dense kernel then runs its body without histograms.
HS_HD Params call_params(Params p, int on) {
  p.flags = call_flags(p.flags, on);
  return p;
}

// Whether the dense loop issues its next pass's loads before consuming this pass's (float32: memory-bound, and its
// registers allow the second buffer without a spill).
template <typename T>
constexpr bool kPipelined = std::is_same_v<T, float>;

// The launch's tensor that block `block` works on.
HS_HD int target_of(const Batch& b, int block) {
  int ti = 0;
  while (ti + 1 < b.count && block >= b.block_start[ti + 1]) ++ti;
  return ti;
}
// blockIdx.x read anew (the compiler would otherwise keep what it derived from the first read live instead).
__device__ __forceinline__ int block_index_again() {
#if defined(__CUDA_ARCH__)
  unsigned r;
  asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(r));
  return static_cast<int>(r);
#else
  return static_cast<int>(blockIdx.x);
#endif
}

template <typename T, bool kLin, bool kLog, bool kFloat>
__device__ __forceinline__ void dense_body(const Batch& b, int ti, const Params& p, BlockShared& sm, bool hists) {
  const Target& tg = b.t[ti];
  const int bid = static_cast<int>(blockIdx.x) - b.block_start[ti], nblk = b.block_start[ti + 1] - b.block_start[ti];
  using A = typename Acc<T>::type;
  constexpr int V = 16 / sizeof(T);
  constexpr int U = V == 2 ? 1 : kUnroll;            // fp64: one load in flight (else it spills at 64 registers)
  // chunks of 2 vectors: 8 fp32 values; 16 bf16/fp16 values with HS_PAIR_CHUNK16 and neither the linear nor the
  // log2 histograms (whose registers spill with them); else one vector (fp64: 2 values)
  constexpr int kChunkVecs = V == 4 || (V == 8 && !kLin && !kLog && HS_PAIR_CHUNK16) ? 2 : 1;
  constexpr bool kU = kUnderflowCheck<T>;
  constexpr Hists h{kLin, kLog, kFloat};
  static_assert(U % kChunkVecs == 0, "chunks must tile the unrolled loads");
  if constexpr (kFloat && kTinyInZeroSlots<T>) {
    if (threadIdx.x == 0) sm.tiny[0] = sm.tiny[1] = 0u;  // ordered by zero_hists' barrier
  }
  unsigned* const warp = zero_hists(p);
  ThreadStats<A, std::conditional_t<kFloat && kTinyInZeroSlots<T>, unsigned, double>> t;
  t.mn = t.mx = nan_acc(A(0));
  // M values from the 16-byte vectors r (bf16/fp16: in pairs as well)
  [[maybe_unused]] auto pairs = [&] {
    if constexpr (kPaired<T>) return PairStats<T>(p);
    else return 0;
  }();
  const auto consume_vecs = [&](const uint4* r, auto vecs) {
    constexpr int N = decltype(vecs)::value, M = N * V;
    A v[M];
#pragma unroll
    for (int u = 0; u < N; ++u) unpack<T>(r[u], v + u * V);
    if constexpr (kPaired<T>) {
      uint32_t w[M / 2];
      memcpy(w, r, sizeof(w));
      consume_pairs<M, kU, T>(t, pairs, w, v, p, h, warp, hists);
    } else {
      consume<M, kU, true>(t, v, p, h, warp, hists);
    }
  };

  const T* x = static_cast<const T*>(tg.x);
  // both < 2^31 (blocks_for caps the grid): 32-bit products where ptxas wants them (fp32: else it spills the
  // loop's addresses at 64 registers; the other dtypes' loops take more instructions with a 32-bit gtid)
  const int64_t gtid = std::is_same_v<T, float>
                           ? static_cast<int64_t>(static_cast<unsigned>(bid) * blockDim.x + threadIdx.x)
                           : static_cast<int64_t>(bid) * blockDim.x + threadIdx.x;
  const int64_t gstride = static_cast<int64_t>(static_cast<unsigned>(nblk) * blockDim.x);
  // kTinyInZeroSlots: a scalar value's tiny count as it goes (zeroed before zero_hists' barrier)
  [[maybe_unused]] const auto count_tiny = [&](T e) {
    if constexpr (kFloat && kTinyInZeroSlots<T>) {
      uint16_t bits;
      memcpy(&bits, &e, 2);
      if (hists && tiny_bf16(bits)) shared_inc(&sm.tiny[bits >> 15]);
    }
  };
  for (int64_t i = gtid; i < tg.head; i += gstride) {
    const A v[1] = {to_acc(x[i])};
    consume<1, kU, true, A, kZerosNatural<T>>(t, v, p, h, warp, hists);
    count_tiny(x[i]);
  }
  if constexpr (kPaired<T>) pairs.take_from(t);
  const uint4* xv = reinterpret_cast<const uint4*>(x + tg.head);
  int64_t j = gtid;
  const auto load = [&](uint4 (&r)[U], int64_t at) {
#pragma unroll
    for (int u = 0; u < U; ++u) r[u] = HS_LDG16(xv + at + u * gstride);  // all loads first
  };
  const auto consume_all = [&](const uint4 (&r)[U]) {
#pragma unroll
    for (int g = 0; g < U; g += kChunkVecs) consume_vecs(r + g, std::integral_constant<int, kChunkVecs>{});
  };
  const auto full = [&](int64_t at) { return at + (U - 1) * gstride < tg.nvec; };
  if constexpr (kPipelined<T>) {
    // Software-pipelined: the next pass's loads are issued before this pass's values are consumed, so a thread keeps
    // U x 16 bytes in flight throughout (tests/test_ptxas.py counts them in the SASS). Two buffers in turn (a copy
    // from one to the other would wait for its load). A chunk whose fast path does not stand leaves the loop (no call
    // inside it, which would hold the loads in flight across it): its pass is read again and finished, and the
    // pipeline restarts after it.
    static_assert(!kPaired<T>, "the pipelined loop consumes unpaired values");
    constexpr int M = kChunkVecs * V;
    // false if chunk `bad` of r does not stand (its integer statistics counted, nothing else; the earlier ones done)
    const auto consume_fast = [&](const uint4 (&r)[U], int& bad) {
#pragma unroll
      for (int g = 0; g < U; g += kChunkVecs) {
        A v[M];
#pragma unroll
        for (int u = 0; u < kChunkVecs; ++u) unpack<T>(r[g + u], v + u * V);
        if (!consume<M, kU, true, A, false, true>(t, v, p, h, warp, hists)) {
          bad = g;
          return false;
        }
      }
      return true;
    };
    // pointers, not indices: a pass's addresses and its test cost an add and a compare each
    const uint32_t stride = static_cast<uint32_t>(gstride);
    const auto load_at = [&](uint4 (&r)[U], const uint4* q) {
#pragma unroll
      for (int u = 0; u < U; ++u) r[u] = HS_LDG16(q + u * stride);
    };
    // a pass at q is whole while q < last (q + (U - 1) x stride < the end), compared as addresses
    const uintptr_t last = reinterpret_cast<uintptr_t>(xv + tg.nvec) - (U - 1) * static_cast<uintptr_t>(stride) * 16u;
    const auto whole = [&](const uint4* at) { return reinterpret_cast<uintptr_t>(at) < last; };
    const uintptr_t step = static_cast<uintptr_t>(U) * stride * 16u;
    const auto next = [&](const uint4* at) { return reinterpret_cast<const uint4*>(reinterpret_cast<uintptr_t>(at) + step); };
    const uint4* q = xv + j;
    while (whole(q)) {
      uint4 a[U], b[U];
      load_at(a, q);
      int bad = 0;
      bool stood;
      for (;;) {
        bool more = whole(next(q));
        if (more) load_at(b, next(q));
        stood = consume_fast(a, bad);
        if (!stood) break;
        q = next(q);
        if (!more) break;
        more = whole(next(q));
        if (more) load_at(a, next(q));
        stood = consume_fast(b, bad);
        if (!stood) break;
        q = next(q);
        if (!more) break;
      }
      if (stood) break;
      load_at(a, q);  // the pass whose chunk `bad` did not stand, read again
#pragma unroll
      for (int g = 0; g < U; g += kChunkVecs) {
        if (g < bad) continue;
        if (g == bad) {
          A v[M];
#pragma unroll
          for (int u = 0; u < kChunkVecs; ++u) unpack<T>(a[g + u], v + u * V);
          redo_consumed(t, v, p);
        } else {
          consume_vecs(a + g, std::integral_constant<int, kChunkVecs>{});
        }
      }
      q = next(q);
    }
    j = q - xv;
  } else {
    for (; full(j); j += U * gstride) {
      uint4 r[U];
      load(r, j);
      consume_all(r);
    }
  }
  for (; j < tg.nvec; j += gstride) {
    const uint4 r[1] = {HS_LDG16(xv + j)};
    consume_vecs(r, std::integral_constant<int, 1>{});
  }
  // The pipelined loop's second buffer, and bf16's running tiny minimum, leave no register to hold the block's place
  // across the loop (it spills): found again from the launch's table.
  constexpr bool kRederive = kPipelined<T> || (kFloat && kTinyInZeroSlots<T>);
  const int tk = [&] {
    if constexpr (kRederive) return target_of(b, block_index_again());
    else return ti;
  }();
  const Target& tt = b.t[tk];
  const int tbid = [&] {
    if constexpr (kRederive) return static_cast<int>(blockIdx.x) - b.block_start[tk];
    else return bid;
  }();
  const int tnblk = [&] {
    if constexpr (kRederive) return b.block_start[tk + 1] - b.block_start[tk];
    else return nblk;
  }();
  const int64_t tgtid = [&] {
    if constexpr (kRederive) return static_cast<int64_t>(static_cast<unsigned>(tbid) * blockDim.x + threadIdx.x);
    else return gtid;
  }();
  const int64_t tgstride = [&] {
    if constexpr (kRederive) return static_cast<int64_t>(static_cast<unsigned>(tnblk) * blockDim.x);
    else return gstride;
  }();
  for (int64_t i = tt.head + tt.nvec * V + tgtid; i < tt.n; i += tgstride) {
    const A v[1] = {to_acc(static_cast<const T*>(tt.x)[i])};
    consume<1, kU, true, A, kZerosNatural<T>>(t, v, p, h, warp, hists);
    count_tiny(static_cast<const T*>(tt.x)[i]);
  }
  if constexpr (kFloat && kTinyInZeroSlots<T>) {
    // the vectors' tiny values, read again where the running minimum saw one (never on ordinary data)
    if (hists && tiny_seen(pairs.tiny)) {
      const uint4* tv = reinterpret_cast<const uint4*>(static_cast<const T*>(tt.x) + tt.head);
      for (int64_t k = tgtid; k < tt.nvec; k += tgstride) {
        const uint4 r = HS_LDG16(tv + k);
        const uint32_t ws[4] = {r.x, r.y, r.z, r.w};
        for (int q = 0; q < 8; ++q) {
          const uint32_t bits = (ws[q / 2] >> (16 * (q % 2))) & 0xffffu;
          if (tiny_bf16(bits)) shared_inc(&sm.tiny[bits >> 15]);
        }
      }
    }
  }
  if constexpr (kPaired<T>) pairs.fold_into(t);
  __syncthreads();
  if constexpr (kFloat && kZerosNatural<T>) {
    if (hists && threadIdx.x == 0) {  // before finish_block's barrier, which orders the flush
      if constexpr (kTinyInZeroSlots<T>) {
        move_zeros(float_hist(), sm.tiny);
      } else {
        const unsigned none[2] = {0u, 0u};
        move_zeros(float_hist(), none);
      }
    }
  }
  if constexpr (kChunkVecs == 2 && kPaired<T> && !kRederive) {
    // 16 paired values a chunk: the block's place read again from the launch's table (held across the loop, it
    // spills)
    finish_block(t, tg, static_cast<int>(blockIdx.x) - b.block_start[ti], b.block_start[ti + 1] - b.block_start[ti],
                 p, sm);
  } else {
    finish_block(t, tt, tbid, tnblk, p, sm);
  }
}

// Dense tensors (contiguous, channels_last, permuted: read as flat memory), one or many per launch; one
// instantiation per histogram setting (p.flags must match kLin, kLog, kFloat: dense_kernel_for picks it).
template <typename T, bool kLin, bool kLog, bool kFloat>
__global__ void __launch_bounds__(kThreads, kBlocksPerSM)
    dense_kernel(const Batch b, const Params p, const unsigned char* enabled, int enabled_bytes) {
  const int on = flag_value(enabled, enabled_bytes);
  if (!on) return;
  HS_SHARED(BlockShared, sm);
  dense_body<T, kLin, kLog, kFloat>(b, target_of(b, blockIdx.x), call_params(p, on), sm, !(on & kSkipHist));
}

using DenseKernel = void (*)(const Batch, const Params, const unsigned char*, int);
template <typename T, bool kLin, bool kLog>
DenseKernel dense_kernel_float(bool flt) {
  return flt ? dense_kernel<T, kLin, kLog, true> : dense_kernel<T, kLin, kLog, false>;
}
// The dense kernel for p.flags' histograms (the launcher and the emulation driver launch through it).
template <typename T>
DenseKernel dense_kernel_for(int flags) {
  const bool lin = flags & kLinearHist, lg = flags & kLogHist, flt = flags & kFloatHist;
  if (lin) return lg ? dense_kernel_float<T, true, true>(flt) : dense_kernel_float<T, true, false>(flt);
  return lg ? dense_kernel_float<T, false, true>(flt) : dense_kernel_float<T, false, false>(flt);
}

// Any other view, read in place through its strides (logical elements, as torch reductions count).
template <typename T>
__global__ void __launch_bounds__(kThreads, kBlocksPerSM)
    strided_kernel(const Target tg, const Strided st, const Params prm, const unsigned char* enabled,
                   int enabled_bytes) {
  using A = typename Acc<T>::type;
  const int on = flag_value(enabled, enabled_bytes);
  if (!on) return;
  HS_SHARED(BlockShared, sm);
  const Params p = call_params(prm, on);
  const Hists h = hists_of(p);
  unsigned* const warp = zero_hists(p);
  ThreadStats<A> t;
  t.mn = t.mx = nan_acc(A(0));
  const T* x = static_cast<const T*>(tg.x);
  // Element i's offset, and its index along the innermost dim: one div/mod per dim, once per chunk; the chunk's
  // next elements step along the innermost dim (a carry into the outer dims recomputes).
  const int64_t inner = st.ndim ? st.sizes[st.ndim - 1] : 1, inner_stride = st.ndim ? st.strides[st.ndim - 1] : 0;
  const auto offset = [&](int64_t i, int64_t& r) {
    int64_t off = 0;
    r = st.ndim ? i % inner : 0;
    for (int d = st.ndim - 1; d >= 0; --d) {
      off += (i % st.sizes[d]) * st.strides[d];
      i /= st.sizes[d];
    }
    return off;
  };
  const int bid = blockIdx.x, nblk = gridDim.x;
  const int64_t gtid = static_cast<int64_t>(bid) * blockDim.x + threadIdx.x;
  const int64_t gstride = static_cast<int64_t>(nblk) * blockDim.x;
  constexpr int C = sizeof(T) == 8 ? kStridedChunk / 4 : kStridedChunk;  // fp64: 2 (4 spill at 64 registers)
  const int64_t nchunks = tg.n / C;
  for (int64_t c = gtid; c < nchunks; c += gstride) {
    A v[C];
    int64_t r;
    int64_t off = offset(c * C, r);
#pragma unroll
    for (int k = 0; k < C; ++k) {
      v[k] = to_acc(x[off]);
      if (k + 1 < C) {
        if (++r < inner) {
          off += inner_stride;
        } else {
          off = offset(c * C + k + 1, r);
        }
      }
    }
    consume<C, kUnderflowCheck<T>, false>(t, v, p, h, warp, true);
  }
  for (int64_t i = nchunks * C + gtid; i < tg.n; i += gstride) {
    int64_t r;
    const A v[1] = {to_acc(x[offset(i, r)])};
    consume<1, kUnderflowCheck<T>, false>(t, v, p, h, warp, true);
  }
  __syncthreads();
  finish_block(t, tg, bid, nblk, p, sm);
}

}  // namespace cuda_kernel
}  // namespace hookstats
