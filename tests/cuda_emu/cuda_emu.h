// cuda_emu.h -- runs a CUDA kernel's source as C++: one std::thread per CUDA thread, every block of the
// grid at once (so last-block-done really races), real barriers, warp shuffles through an exchange buffer,
// relaxed atomics and poisoned shared memory. Built with TSan / ASan+UBSan by tests/test_cuda_emulation.py.
#pragma once
#define HS_CPU_EMULATION 1
#include <cuda/atomic>  // libcu++ works on the host: the kernel's ticket code compiles unchanged
#include <cuda_bf16.h>  // host-usable; also brings dim3, uint3 and uint4
#include <cuda_fp16.h>

#include <array>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <typeindex>
#include <vector>

#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __noinline__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)

namespace cuda_emu {

// A mutex/condvar barrier: ThreadSanitizer models pthread primitives exactly (it ignores bare fences).
struct Barrier {
  std::mutex m;
  std::condition_variable cv;
  int n, count = 0;
  unsigned gen = 0;
  explicit Barrier(int n_) : n(n_) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lk(m);
    const unsigned g = gen;
    if (++count == n) {
      count = 0;
      ++gen;
      cv.notify_all();
    } else {
      cv.wait(lk, [&] { return gen != g; });
    }
  }
};

constexpr unsigned char kPoison = 0xAB;  // shared memory starts as garbage, as on a GPU

struct Block {
  Block(int nthreads, size_t dyn) : bar(nthreads), dyn_smem(dyn + 16) {
    std::memset(dyn_smem.data(), kPoison, dyn_smem.size());
    for (int w = 0; w < nthreads / 32; ++w) {
      warp_bar.emplace_back(new Barrier(32));
      warp_slot.emplace_back();
    }
  }
  Barrier bar;
  std::vector<std::unique_ptr<Barrier>> warp_bar;
  std::vector<std::array<uint64_t, 32>> warp_slot;
  std::vector<unsigned char> dyn_smem;
  std::atomic<int> vote{0};  // __syncthreads_or
  std::mutex static_m;
  std::map<std::type_index, std::shared_ptr<void>> static_smem;
};

inline thread_local uint3 tl_threadIdx, tl_blockIdx;
inline thread_local Block* tl_block = nullptr;
inline dim3 g_blockDim, g_gridDim;

inline void* dynamic_smem() { return tl_block->dyn_smem.data(); }

template <class T>
T& block_shared() {  // one poisoned T per block: models a __shared__ variable (T must be trivial)
  std::lock_guard<std::mutex> lk(tl_block->static_m);
  auto& p = tl_block->static_smem[std::type_index(typeid(T))];
  if (!p) {
    p = std::shared_ptr<void>(::operator new(sizeof(T)), [](void* q) { ::operator delete(q); });
    std::memset(p.get(), kPoison, sizeof(T));
  }
  return *static_cast<T*>(p.get());
}

inline int lane() { return static_cast<int>(tl_threadIdx.x % 32); }

template <class T>
T shfl(unsigned mask, T v, int src_lane) {
  if (mask != 0xffffffffu) {
    std::fprintf(stderr, "cuda_emu: only full-warp shuffles are modelled\n");
    std::abort();
  }
  static_assert(sizeof(T) <= 8, "shuffle of a value wider than 64 bits");
  auto& slot = tl_block->warp_slot[tl_threadIdx.x / 32];
  auto& bar = *tl_block->warp_bar[tl_threadIdx.x / 32];
  uint64_t raw = 0;
  std::memcpy(&raw, &v, sizeof(T));
  slot[lane()] = raw;  // plain stores and loads: TSan checks that the barrier orders them
  bar.arrive_and_wait();
  raw = slot[src_lane & 31];
  bar.arrive_and_wait();
  T r;
  std::memcpy(&r, &raw, sizeof(T));
  return r;
}

// kernel<<<grid, block, dyn_smem>>>(args...): every thread of every block runs concurrently.
template <class K, class... A>
void launch(unsigned grid, unsigned block, size_t dyn_smem, K kernel, A... args) {
  if (block % 32 != 0 || block == 0 || grid == 0) {
    std::fprintf(stderr, "cuda_emu: bad launch %u x %u\n", grid, block);
    std::abort();
  }
  g_gridDim = dim3(grid);
  g_blockDim = dim3(block);
  std::vector<std::unique_ptr<Block>> blocks;
  for (unsigned b = 0; b < grid; ++b) blocks.emplace_back(new Block(static_cast<int>(block), dyn_smem));
  std::vector<std::thread> th;
  for (unsigned b = 0; b < grid; ++b)
    for (unsigned t = 0; t < block; ++t)
      th.emplace_back([&, b, t] {
        tl_block = blocks[b].get();
        tl_blockIdx = uint3{b, 0, 0};
        tl_threadIdx = uint3{t, 0, 0};
        kernel(args...);
      });
  for (auto& x : th) x.join();
}

}  // namespace cuda_emu

#define threadIdx (::cuda_emu::tl_threadIdx)
#define blockIdx (::cuda_emu::tl_blockIdx)
#define blockDim (::cuda_emu::g_blockDim)
#define gridDim (::cuda_emu::g_gridDim)

inline void __syncthreads() { ::cuda_emu::tl_block->bar.arrive_and_wait(); }
// Every thread votes, then reads the block's OR; the third barrier keeps thread 0's reset out of the next vote.
inline int __syncthreads_or(int pred) {
  auto* b = ::cuda_emu::tl_block;
  if (pred) b->vote.fetch_or(1);
  b->bar.arrive_and_wait();
  const int any = b->vote.load();
  b->bar.arrive_and_wait();
  if (::cuda_emu::tl_threadIdx.x == 0) b->vote.store(0);
  b->bar.arrive_and_wait();
  return any;
}
template <class T>
T __shfl_down_sync(unsigned m, T v, unsigned d) {
  const int s = ::cuda_emu::lane() + static_cast<int>(d);
  return ::cuda_emu::shfl(m, v, s < 32 ? s : ::cuda_emu::lane());
}
// CUDA's atomicAdd is relaxed: modelled as relaxed, so missing ordering stays visible to TSan.
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  return std::atomic_ref<unsigned>(*p).fetch_add(v, std::memory_order_relaxed);
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  return std::atomic_ref<unsigned long long>(*p).fetch_add(v, std::memory_order_relaxed);
}
