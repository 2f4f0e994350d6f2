// accumulate_launch.cu -- every instantiation of the kernels in accumulate_kernel.cuh and their launch, with no
// torch headers: tests/test_ptxas.py compiles this file alone to gate registers, spills and local memory.
#include "accumulate_launch.h"
#include "accumulate_kernel.cuh"

namespace hookstats {
namespace cuda_kernel {
namespace {

template <typename T>
cudaError_t launch_dense_typed(const Batch& b, const Params& p, const LaunchConfig& c) {
  const bool lin = p.flags & kLinearHist, lg = p.flags & kLogHist;
  const int grid = b.block_start[b.count];
  const size_t smem = dyn_smem_bytes(p, c.threads);
  if (lin && lg) dense_kernel<T, true, true><<<grid, c.threads, smem, c.stream>>>(b, p, c.enabled, c.enabled_bytes);
  else if (lin) dense_kernel<T, true, false><<<grid, c.threads, smem, c.stream>>>(b, p, c.enabled, c.enabled_bytes);
  else if (lg) dense_kernel<T, false, true><<<grid, c.threads, smem, c.stream>>>(b, p, c.enabled, c.enabled_bytes);
  else dense_kernel<T, false, false><<<grid, c.threads, smem, c.stream>>>(b, p, c.enabled, c.enabled_bytes);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_strided_typed(const Target& t, const Strided& s, int grid, const Params& p, const LaunchConfig& c) {
  strided_kernel<T><<<grid, c.threads, dyn_smem_bytes(p, c.threads), c.stream>>>(t, s, p, c.enabled, c.enabled_bytes);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_dense(DType d, const Batch& b, const Params& p, const LaunchConfig& c) {
  switch (d) {
    case DType::kFloat: return launch_dense_typed<float>(b, p, c);
    case DType::kDouble: return launch_dense_typed<double>(b, p, c);
    case DType::kHalf: return launch_dense_typed<__half>(b, p, c);
    case DType::kBFloat16: return launch_dense_typed<__nv_bfloat16>(b, p, c);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_strided(DType d, const Target& t, const Strided& s, int grid, const Params& p,
                           const LaunchConfig& c) {
  switch (d) {
    case DType::kFloat: return launch_strided_typed<float>(t, s, grid, p, c);
    case DType::kDouble: return launch_strided_typed<double>(t, s, grid, p, c);
    case DType::kHalf: return launch_strided_typed<__half>(t, s, grid, p, c);
    case DType::kBFloat16: return launch_strided_typed<__nv_bfloat16>(t, s, grid, p, c);
  }
  return cudaErrorInvalidValue;
}

}  // namespace cuda_kernel
}  // namespace hookstats
