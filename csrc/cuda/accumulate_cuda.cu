// accumulate_cuda.cu -- the CUDA launcher of hookstats::accumulate_ / accumulate_many_ and its registration.
// Checks, grid planning from the cached SM count, launch on the current stream: no host sync, no
// allocation, no memset, so a call is safe inside CUDA graph capture. The kernels are in accumulate_kernel.cuh.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <vector>

#include "../check_args.h"
#include "accumulate_launch.h"

namespace hookstats {
namespace cuda_kernel {
namespace {

constexpr int kMaxDevices = 64;

// kBlocksPerSM x SM count, queried once per device (never inside a captured step).
int device_max_blocks(int device) {
  static std::array<std::atomic<int>, kMaxDevices> cache{};
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "hookstats: CUDA device index ", device, " out of range");
  int v = cache[device].load(std::memory_order_relaxed);
  if (v == 0) {
    int sms = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    v = kBlocksPerSM * sms;
    cache[device].store(v, std::memory_order_relaxed);
  }
  return v;
}

int64_t cuda_scratch_bytes(int64_t device) { return scratch_bytes_for(device_max_blocks(static_cast<int>(device))); }

DType dtype_of(const at::Tensor& x) {
  switch (x.scalar_type()) {
    case at::kFloat: return DType::kFloat;
    case at::kDouble: return DType::kDouble;
    case at::kHalf: return DType::kHalf;
    case at::kBFloat16: return DType::kBFloat16;
    default: TORCH_CHECK(false, "hookstats.accumulate_: x must be float32, float64, float16 or bfloat16, got ", x.scalar_type());
  }
}

int enabled_bytes(const at::Tensor& e) { return static_cast<int>(e.element_size()); }  // dtype checked

// The rest of scratch's checks are check_args.h's (uint8, contiguous, on x's device).
void check_scratch_alignment(Op op, const at::Tensor& scratch) {
  TORCH_CHECK(scratch.numel() == 0 || reinterpret_cast<uintptr_t>(scratch.const_data_ptr()) % 8 == 0,
              op, "scratch must be 8-byte aligned (hookstats.state.scratch_bytes(device) bytes of its own, "
              "zeroed once at creation)");
}

// Blocks for one tensor: from its size, capped by the device and by what its scratch can hold.
int plan_blocks(const at::Tensor& x, const at::Tensor& scratch, const Params& p) {
  const int64_t n = x.numel();
  int cap = device_max_blocks(x.get_device());
  const int64_t fits = (scratch.numel() - kTicketBytes) / static_cast<int64_t>(sizeof(BlockPartial));
  if (fits < cap) {
    TORCH_WARN_ONCE("hookstats.accumulate_: the scratch tensor holds ", scratch.numel(), " bytes, the GPU wants ",
                    scratch_bytes_for(cap), " (hookstats.state.scratch_bytes): fewer blocks, lower bandwidth");
    cap = fits > 1 ? static_cast<int>(fits) : 1;
  }
  const int blocks = blocks_for(n, static_cast<int>(x.element_size()), kThreads, cap);
  // shared-memory histograms count in 32 bits (per warp; the float buckets per block)
  TORCH_CHECK(n / blocks < max_block_elems(p, kThreads),
              "hookstats.accumulate_: ", n, " elements are too many for ", blocks, " blocks; give the state a scratch "
              "of hookstats.state.scratch_bytes(device) bytes");
  return blocks;
}

bool make_strided(const at::Tensor& x, Strided& s) {
  return coalesce(x.sizes().data(), x.strides().data(), static_cast<int>(x.dim()), s);
}

Target target_of(const at::Tensor& x, at::Tensor& fstate, at::Tensor& istate, at::Tensor& scratch) {
  return make_target(x.const_data_ptr(), x.numel(), static_cast<int>(x.element_size()), fstate.data_ptr<double>(),
                     istate.data_ptr<int64_t>(), scratch.data_ptr());
}

LaunchConfig config_of(const at::Tensor& x, const at::Tensor& enabled) {
  return LaunchConfig{kThreads, c10::cuda::getCurrentCUDAStream(x.get_device()).stream(),
                      static_cast<const unsigned char*>(enabled.const_data_ptr()), enabled_bytes(enabled)};
}

// Launches one tensor whose arguments were checked.
void launch_one(const at::Tensor& x, at::Tensor& fstate, at::Tensor& istate, at::Tensor& scratch,
                const at::Tensor& enabled, const Params& p) {
  const int blocks = plan_blocks(x, scratch, p);
  const LaunchConfig c = config_of(x, enabled);
  if (x.is_non_overlapping_and_dense()) {  // contiguous, channels_last, permuted: flat memory, no copy
    Batch b{};
    b.count = 1;
    b.block_start[1] = blocks;
    b.t[0] = target_of(x, fstate, istate, scratch);
    C10_CUDA_CHECK(launch_dense(dtype_of(x), b, p, c));
    return;
  }
  Strided s{};
  if (make_strided(x, s)) {
    const Target t = target_of(x, fstate, istate, scratch);
    C10_CUDA_CHECK(launch_strided(dtype_of(x), t, s, blocks, p, c));
    return;
  }
  const at::Tensor xc = x.contiguous();  // more than kMaxDims dims that do not coalesce: rare
  launch_one(xc, fstate, istate, scratch, enabled, p);
}

void accumulate_cuda(const at::Tensor& x, at::Tensor& fstate, at::Tensor& istate, at::Tensor& scratch,
                     const at::Tensor& enabled, double lo, double inv_w, double eps, int64_t nbins, int64_t flags) {
  check_one_call(x, fstate, istate, scratch, enabled, lo, inv_w, eps, nbins, flags);
  check_scratch_alignment(Op{-1}, scratch);
  if (x.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(x.device());
  launch_one(x, fstate, istate, scratch, enabled, make_params(lo, inv_w, eps, nbins, flags));
}

// Dense tensors of one dtype share launches of up to kMaxTargets tensors; other views go one by one.
// Every argument is checked before the first launch, so a bad list changes no state. No two entries share a
// state (check_args.h): blocks of one launch would share its ticket.
void accumulate_many_cuda(at::TensorList xs, at::TensorList fstates, at::TensorList istates, at::TensorList scratches,
                          const at::Tensor& enabled, double lo, double inv_w, double eps, int64_t nbins, int64_t flags) {
  check_many_call(xs, fstates, istates, scratches, enabled, lo, inv_w, eps, nbins, flags);
  std::vector<int> blocks(xs.size(), 0);
  const c10::cuda::CUDAGuard guard(enabled.device());
  const Params p = make_params(lo, inv_w, eps, nbins, flags);
  for (size_t k = 0; k < xs.size(); ++k) {
    check_scratch_alignment(Op{static_cast<int64_t>(k)}, scratches[k]);
    if (xs[k].numel()) blocks[k] = plan_blocks(xs[k], scratches[k], p);
  }
  const LaunchConfig c = config_of(enabled, enabled);
  for (const DType d : {DType::kFloat, DType::kBFloat16, DType::kHalf, DType::kDouble}) {
    Batch b{};
    const auto flush = [&] {
      if (b.count) C10_CUDA_CHECK(launch_dense(d, b, p, c));
      b = Batch{};
    };
    for (size_t k = 0; k < xs.size(); ++k) {
      const at::Tensor& x = xs[k];
      if (x.numel() == 0 || dtype_of(x) != d || !x.is_non_overlapping_and_dense()) continue;
      at::Tensor f = fstates[k], i = istates[k], s = scratches[k];
      b.t[b.count] = target_of(x, f, i, s);
      b.block_start[b.count + 1] = b.block_start[b.count] + blocks[k];
      if (++b.count == kMaxTargets) flush();
    }
    flush();
  }
  for (size_t k = 0; k < xs.size(); ++k) {
    if (xs[k].numel() == 0 || xs[k].is_non_overlapping_and_dense()) continue;
    at::Tensor f = fstates[k], i = istates[k], s = scratches[k];
    launch_one(xs[k], f, i, s, enabled, p);
  }
}

}  // namespace
}  // namespace cuda_kernel

// The schema is in ops.cpp; an op without tensor arguments has no dispatch key, so its kernel is the catch-all.
TORCH_LIBRARY_FRAGMENT(hookstats, m) {
  m.impl("cuda_scratch_bytes", &cuda_kernel::cuda_scratch_bytes);
}

TORCH_LIBRARY_IMPL(hookstats, CUDA, m) {
  m.impl("accumulate_", &cuda_kernel::accumulate_cuda);
  m.impl("accumulate_many_", &cuda_kernel::accumulate_many_cuda);
}

}  // namespace hookstats
