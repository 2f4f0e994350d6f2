// kernel_plan.h -- what the CUDA launcher (accumulate_cuda.cpp, plain C++ against ATen) shares with the kernels
// (accumulate_kernel.cuh) and the emulation driver: the launch's argument structures, the scratch layout, the tuning
// constants and the host-side planning (blocks per tensor, alignment, a view's coalesced dims, shared memory).
// No device code, so the launcher compiles without nvcc.
#pragma once
#include <cstdint>

#include "../accumulator.h"
#include "../counters.h"

namespace hookstats {
namespace cuda_kernel {

constexpr int kWarp = 32;
constexpr int kThreads = 512;       // block size on the GPU; the kernels read blockDim (tests use 64-128)
constexpr int kMaxWarps = kThreads / kWarp;
// The three tuning constants can be overridden at build time (HOOKSTATS_NVCC_FLAGS="-DHS_MIN_ITERS=1"):
// benchmarks/gpu_tune.sh builds and measures such variants side by side.
#ifndef HS_BLOCKS_PER_SM
#define HS_BLOCKS_PER_SM 2
#endif
#ifndef HS_UNROLL
#define HS_UNROLL 2
#endif
#ifndef HS_MIN_ITERS
#define HS_MIN_ITERS 1
#endif
constexpr int kBlocksPerSM = HS_BLOCKS_PER_SM;  // persistent grid: kBlocksPerSM x SMs blocks at most per tensor
constexpr int kUnroll = HS_UNROLL;              // 16-byte loads in flight per thread before they are consumed
constexpr int kMinIters = HS_MIN_ITERS;         // a block gets >= kMinIters full iterations per thread, else fewer blocks
// 16-bit values in chunks of 16 (two vectors) where the registers allow it: sm_90, and the CPU emulation that tests
// the path; sm_80 compares bf16 pairs in several instructions and spills with them.
#if !defined(HS_PAIR_CHUNK16)
#if defined(HS_CPU_EMULATION) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900)
#define HS_PAIR_CHUNK16 1
#else
#define HS_PAIR_CHUNK16 0
#endif
#endif
constexpr int kMaxTargets = 32;     // tensors per multi-tensor launch (a table in the kernel arguments)
constexpr int kMaxDims = 8;         // strided path: dims after coalescing
constexpr int kStridedChunk = 8;    // strided path: logical elements a thread consumes together (fp64: 4)

// scratch (uint8, zeroed once at creation): ticket | BlockPartial per block of the grid. Also what the reductions
// carry from thread to warp to block: shifted sums (accumulator.h Sums, merged without a division) and min/max.
struct BlockPartial {
  Sums s;
  double mn, mx;
};
// The block's static shared memory beside the histograms (the launcher counts it against the device's limit). Plain
// arrays: a __shared__ variable cannot have constructors.
struct BlockShared {
  BlockPartial part[kMaxWarps];
  unsigned counts[kOpCounters][kMaxWarps];  // each warp's op counters (counters.h)
  unsigned tiny[2];  // bf16 float buckets: the block's nonzero values in slots 0 (+) and 2048 (-) (accumulate_kernel.cuh)
  int last;
};
constexpr int64_t kTicketBytes = 64;
HS_HD int64_t scratch_bytes_for(int max_blocks) {
  return kTicketBytes + static_cast<int64_t>(max_blocks) * static_cast<int64_t>(sizeof(BlockPartial));
}
// Blocks whose partials a scratch of `bytes` holds beside the ticket (0: not even one block's, nor maybe the ticket).
HS_HD int64_t blocks_scratch_holds(int64_t bytes) {
  return bytes < kTicketBytes ? 0 : (bytes - kTicketBytes) / static_cast<int64_t>(sizeof(BlockPartial));
}

// One tensor of a launch: head scalars up to 16-byte alignment, nvec 16-byte vectors, then a scalar tail.
struct Target {
  const void* x;
  int64_t n, head, nvec;
  double* fs;
  unsigned long long* is;
  unsigned char* scratch;
};
// Blocks [block_start[i], block_start[i+1]) of the launch work on t[i].
struct Batch {
  int count;
  int block_start[kMaxTargets + 1];
  Target t[kMaxTargets];
};
// A view that is not dense: coalesced sizes/strides in elements, innermost last.
struct Strided {
  int ndim;
  int64_t sizes[kMaxDims], strides[kMaxDims];
};

// ---- host-side planning (shared by the launcher and the emulation driver) ----
HS_HD int values_per_vec(int elem_bytes) { return 16 / elem_bytes; }

HS_HD int blocks_for(int64_t n, int elem_bytes, int threads, int max_blocks) {
  const int64_t per_block = static_cast<int64_t>(threads) * values_per_vec(elem_bytes) * kUnroll * kMinIters;
  const int64_t b = (n + per_block - 1) / per_block;
  return b < 1 ? 1 : (b > max_blocks ? max_blocks : static_cast<int>(b));
}

inline Target make_target(const void* x, int64_t n, int elem_bytes, double* fs, int64_t* is, void* scratch) {
  const auto a = reinterpret_cast<uintptr_t>(x);
#if defined(HS_BUG_IGNORE_ALIGNMENT)
  int64_t head = 0;
#else
  int64_t head = a % elem_bytes ? n : static_cast<int64_t>((16 - a % 16) % 16) / elem_bytes;
#endif
  if (head > n) head = n;
  const int64_t nvec = (n - head) / values_per_vec(elem_bytes);
  return Target{x, n, head, nvec, fs, reinterpret_cast<unsigned long long*>(is),
                static_cast<unsigned char*>(scratch)};
}

// A view's (size, stride) dims, size-1 dims dropped and mergeable neighbours merged; false if more than
// kMaxDims remain. Stride-0 (broadcast) dims stay: every logical element counts, as in torch reductions.
inline bool coalesce(const int64_t* sizes, const int64_t* strides, int ndim, Strided& s) {
  s.ndim = 0;
  for (int d = 0; d < ndim; ++d) {
    if (sizes[d] == 1) continue;
    if (s.ndim > 0 && s.strides[s.ndim - 1] == strides[d] * sizes[d]) {
      s.sizes[s.ndim - 1] *= sizes[d];
      s.strides[s.ndim - 1] = strides[d];
    } else {
      if (s.ndim == kMaxDims) return false;
      s.sizes[s.ndim] = sizes[d];
      s.strides[s.ndim] = strides[d];
      ++s.ndim;
    }
  }
  return true;
}

// Dynamic shared memory: the block's 32-bit float buckets (kFloatHist: kFloatSlots, one table per block, at
// offset 0), then one 32-bit histogram per warp: linear slots, then (with the log histogram) log2 slots and a
// dummy slot for non-finite values. Slots [kept_first, hist_used) of a warp's histogram go to istate (the window
// the flags keep, accumulator.h).
HS_HD int hist_used(const Params& p) {
  return static_cast<int>(lin_slots(p.nbins)) + ((p.flags & kLogHist) ? kLogSlots : 0);
}
HS_HD int hist_stride(const Params& p) { return hist_used(p) + ((p.flags & kLogHist) ? 1 : 0); }
HS_HD int float_words(const Params& p) { return (p.flags & kFloatHist) ? kFloatSlots : 0; }
HS_HD int dyn_smem_bytes(const Params& p, int threads) {
  return (float_words(p) + (threads / kWarp) * hist_stride(p)) * static_cast<int>(sizeof(unsigned));
}
// Elements one block may see (n / blocks, checked by the launcher): a block's 32-bit counters must not wrap --
// its warps' histograms, its float buckets, the near-zero total of its warps (warp_merge, unsigned) -- and a
// thread's float near-zero count (ThreadStats) must stay exact. 2^31 leaves every u32 total 2x headroom over
// what the grid-stride loops give one block beyond n / blocks (under threads x 16 + 16 elements), however
// small the scratch (few blocks); threads x 2^23 keeps a thread's float count below 2^24.
HS_HD int64_t max_block_elems(const Params&, int threads) {
  const int64_t counters = int64_t(1) << 31;
  const int64_t per_thread = int64_t(threads) << 23;
  return counters < per_thread ? counters : per_thread;
}

}  // namespace cuda_kernel
}  // namespace hookstats
