// accumulate_cuda.cpp -- the CUDA launcher of hookstats::accumulate_ / accumulate_many_ and its registration.
// Checks, grid planning from the cached SM count, launch on the current stream: no host sync, no
// allocation, no memset, so a call is safe inside CUDA graph capture. The kernels are in accumulate_kernel.cuh.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <vector>

#include "../check_args.h"
#include "accumulate_launch.h"
#include "stream_order.h"

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

// The most shared memory one block may have on the device (opt-in), queried once per device.
int device_max_smem(int device) {
  static std::array<std::atomic<int>, kMaxDevices> cache{};
  int v = cache[device].load(std::memory_order_relaxed);
  if (v == 0) {
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    cache[device].store(v, std::memory_order_relaxed);
  }
  return v;
}

struct CudaApi {
  using Stream = cudaStream_t;
  using Event = cudaEvent_t;
  using Owner = c10::weak_intrusive_ptr<c10::StorageImpl>;  // weak: the registry keeps no state's memory alive
  Event create_event() {
    cudaEvent_t e;
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  void destroy_event(Event e) { C10_CUDA_CHECK_WARN(cudaEventDestroy(e)); }
  bool same(const Owner& a, const Owner& b) { return a._unsafe_get_target() == b._unsafe_get_target(); }
  bool alive(const Owner& o) { return !o.expired(); }
  void record(Event e, Stream s) { C10_CUDA_CHECK(cudaEventRecord(e, s)); }
  void wait(Stream s, Event e) { C10_CUDA_CHECK(cudaStreamWaitEvent(s, e, 0)); }
  unsigned long long capture_id(Stream s) {
    cudaStreamCaptureStatus status;
    unsigned long long id = 0;
    const cudaError_t e = cudaStreamGetCaptureInfo(s, &status, &id);
    if (e == cudaErrorStreamCaptureImplicit) {  // the legacy stream while a blocking stream captures: no order
      (void)cudaGetLastError();
      return ~0ull;
    }
    C10_CUDA_CHECK(e);
    return status == cudaStreamCaptureStatusActive ? id : 0;
  }
};

// Every state's last stream (stream_order.h), for all devices: states are keyed by their fstate's address.
StreamOrder<CudaApi>& stream_order() {
  static auto* order = new StreamOrder<CudaApi>();  // never destroyed: launches may come during exit
  return *order;
}

CudaApi::Owner owner_of(const at::Tensor& fstate) {
  return fstate.storage().getWeakStorageImpl();
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
  const int64_t fits = blocks_scratch_holds(scratch.numel());
  // a smaller scratch would have the block write its ticket or partial past the tensor's end, into other memory
  TORCH_CHECK(fits >= 1, "hookstats.accumulate_: the scratch tensor holds ", scratch.numel(), " bytes, fewer than "
              "one block needs on the GPU (", scratch_bytes_for(1), "); give the state hookstats.state.scratch_bytes("
              "device) bytes (", scratch_bytes_for(cap), " here)");
  if (fits < cap) {
    TORCH_WARN_ONCE("hookstats.accumulate_: the scratch tensor holds ", scratch.numel(), " bytes, the GPU wants ",
                    scratch_bytes_for(cap), " (hookstats.state.scratch_bytes): fewer blocks, lower bandwidth");
    cap = static_cast<int>(fits);
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

// One launch of a call, planned before any launch: a dense batch, or one strided view.
struct Work {
  DType dtype;
  bool dense;
  Batch batch;         // dense
  Target target;       // strided
  Strided strided;     // strided
  int blocks;          // strided
  std::vector<CudaApi::Owner> owners;  // of the fstates, in batch order (one for a strided view)
};

// The launch's shared memory must fit the device; its >48 KB attribute is set (prepare_*): both before the
// first launch of a call, so a refusal changes no state.
void prepare(const Work& w, const Params& p, int device) {
  const int64_t need = dyn_smem_bytes(p, kThreads) + static_cast<int64_t>(sizeof(BlockShared));
  TORCH_CHECK(need <= device_max_smem(device), "hookstats.accumulate_: nbins=", p.nbins, " with these histograms "
              "needs ", need, " bytes of shared memory per block, this GPU allows ", device_max_smem(device),
              ": fewer bins, or without the log2 histogram");
  C10_CUDA_CHECK(w.dense ? prepare_dense(w.dtype, p, kThreads) : prepare_strided(w.dtype, p, kThreads));
}

void launch(const Work& w, const Params& p, const LaunchConfig& c) {
  if (w.dense) {
    for (int k = 0; k < w.batch.count; ++k) stream_order().before_launch(w.batch.t[k].fs, w.owners[k], c.stream);
    C10_CUDA_CHECK(launch_dense(w.dtype, w.batch, p, c));
  } else {
    stream_order().before_launch(w.target.fs, w.owners[0], c.stream);
    C10_CUDA_CHECK(launch_strided(w.dtype, w.target, w.strided, w.blocks, p, c));
  }
}

// Plans the launch of one checked tensor (x itself, or `copy` of it: more than kMaxDims dims that do not
// coalesce, rare); false for a dense tensor, which goes into a batch.
bool plan_view(const at::Tensor& x, at::Tensor& fstate, at::Tensor& istate, at::Tensor& scratch, const Params& p,
               std::vector<Work>& out, std::vector<at::Tensor>& copies) {
  if (x.is_non_overlapping_and_dense()) return false;
  Work w{};
  w.dtype = dtype_of(x);
  w.owners.push_back(owner_of(fstate));
  if (make_strided(x, w.strided)) {
    w.target = target_of(x, fstate, istate, scratch);
    w.blocks = plan_blocks(x, scratch, p);
  } else {
    copies.push_back(x.contiguous());
    const at::Tensor& xc = copies.back();
    w.dense = true;
    w.batch.count = 1;
    w.batch.block_start[1] = plan_blocks(xc, scratch, p);
    w.batch.t[0] = target_of(xc, fstate, istate, scratch);
  }
  out.push_back(w);
  return true;
}

void run(const std::vector<Work>& work, const Params& p, const LaunchConfig& c, int device) {
  for (const Work& w : work) prepare(w, p, device);
  const auto held = stream_order().lock();  // until the launches are queued (stream_order.h)
  for (const Work& w : work) launch(w, p, c);
}

void accumulate_cuda(const at::Tensor& x, at::Tensor& fstate, at::Tensor& istate, at::Tensor& scratch,
                     const at::Tensor& enabled, c10::ArrayRef<double> params) {
  const Params p = check_one_call(x, fstate, istate, scratch, enabled, params);
  check_scratch_alignment(Op{-1}, scratch);
  if (x.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(x.device());
  std::vector<Work> work;
  std::vector<at::Tensor> copies;
  if (!plan_view(x, fstate, istate, scratch, p, work, copies)) {
    Work w{};
    w.dtype = dtype_of(x);
    w.dense = true;
    w.batch.count = 1;
    w.batch.block_start[1] = plan_blocks(x, scratch, p);
    w.batch.t[0] = target_of(x, fstate, istate, scratch);
    w.owners.push_back(owner_of(fstate));
    work.push_back(w);
  }
  run(work, p, config_of(x, enabled), x.get_device());
}

// Dense tensors of one dtype share launches of up to kMaxTargets tensors; other views go one by one.
// Every argument is checked and every launch planned and prepared before the first launch, so a bad list
// changes no state. No two entries share a state (check_args.h): blocks of one launch would share its ticket.
void accumulate_many_cuda(at::TensorList xs, at::TensorList fstates, at::TensorList istates, at::TensorList scratches,
                          const at::Tensor& enabled, c10::ArrayRef<double> params) {
  const Params p = check_many_call(xs, fstates, istates, scratches, enabled, params);
  std::vector<int> blocks(xs.size(), 0);
  const c10::cuda::CUDAGuard guard(enabled.device());
  for (size_t k = 0; k < xs.size(); ++k) {
    check_scratch_alignment(Op{static_cast<int64_t>(k)}, scratches[k]);
    if (xs[k].numel() && xs[k].is_non_overlapping_and_dense()) blocks[k] = plan_blocks(xs[k], scratches[k], p);
  }
  std::vector<Work> work;
  for (const DType d : {DType::kFloat, DType::kBFloat16, DType::kHalf, DType::kDouble}) {
    Work w{};
    w.dtype = d;
    w.dense = true;
    for (size_t k = 0; k < xs.size(); ++k) {
      const at::Tensor& x = xs[k];
      if (x.numel() == 0 || dtype_of(x) != d || !x.is_non_overlapping_and_dense()) continue;
      at::Tensor f = fstates[k], i = istates[k], s = scratches[k];
      Batch& b = w.batch;
      b.t[b.count] = target_of(x, f, i, s);
      b.block_start[b.count + 1] = b.block_start[b.count] + blocks[k];
      w.owners.push_back(owner_of(f));
      if (++b.count == kMaxTargets) {
        work.push_back(w);
        w.batch = Batch{};
        w.owners.clear();
      }
    }
    if (w.batch.count) work.push_back(w);
  }
  std::vector<at::Tensor> copies;
  copies.reserve(xs.size());  // targets point into the copies: no reallocation
  for (size_t k = 0; k < xs.size(); ++k) {
    if (xs[k].numel() == 0) continue;
    at::Tensor f = fstates[k], i = istates[k], s = scratches[k];
    plan_view(xs[k], f, i, s, p, work, copies);
  }
  if (!work.empty()) run(work, p, config_of(enabled, enabled), enabled.get_device());
}

// Torch ops on these states (reads, resets, step ends) are about to run on the current stream: it waits for each
// state's last stream, and becomes the stream later launches on them order against (stream_order.h).
void order_states_cuda(at::TensorList fstates) {
  if (fstates.empty()) return;
  const c10::cuda::CUDAGuard guard(fstates[0].device());
  const auto held = stream_order().lock();
  for (const at::Tensor& f : fstates) {
    TORCH_CHECK(f.is_cuda() && f.scalar_type() == at::kDouble && f.numel() == kFState, "hookstats.order_states: "
                "each state must be a CUDA float64 fstate of ", kFState, " elements, got ", f.scalar_type(), " ",
                f.device(), " of ", f.numel());
    TORCH_CHECK(f.device() == fstates[0].device(), "hookstats.order_states: every state must be on ",
                fstates[0].device(), ", got ", f.device());
    stream_order().before_launch(f.const_data_ptr(), owner_of(f),
                                 c10::cuda::getCurrentCUDAStream(f.get_device()).stream());
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
  m.impl("order_states", &cuda_kernel::order_states_cuda);
}

}  // namespace hookstats
