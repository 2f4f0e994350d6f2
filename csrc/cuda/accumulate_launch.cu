// accumulate_launch.cu -- every instantiation of the kernels in accumulate_kernel.cuh and their launch, with no
// torch headers: tests/test_ptxas.py compiles this file alone to gate registers, spills and local memory.
#include "accumulate_launch.h"
#include "accumulate_kernel.cuh"

namespace hookstats {
namespace cuda_kernel {
namespace {

// More than 48 KB of dynamic shared memory (the float buckets with nbins near kMaxBins) must be allowed per
// kernel, once, before its first launch.
template <typename K>
cudaError_t allow_smem(K kernel, size_t smem) {
  if (smem <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(smem));
}

template <typename T>
cudaError_t launch_dense_typed(const Batch& b, const Params& p, const LaunchConfig& c) {
  dense_kernel_for<T>(p.flags)<<<b.block_start[b.count], c.threads, dyn_smem_bytes(p, c.threads), c.stream>>>(
      b, p, c.enabled, c.enabled_bytes);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_strided_typed(const Target& t, const Strided& s, int grid, const Params& p, const LaunchConfig& c) {
  strided_kernel<T><<<grid, c.threads, dyn_smem_bytes(p, c.threads), c.stream>>>(t, s, p, c.enabled, c.enabled_bytes);
  return cudaGetLastError();
}

}  // namespace

cudaError_t prepare_dense(DType d, const Params& p, int threads) {
  const size_t smem = dyn_smem_bytes(p, threads);
  switch (d) {
    case DType::kFloat: return allow_smem(dense_kernel_for<float>(p.flags), smem);
    case DType::kDouble: return allow_smem(dense_kernel_for<double>(p.flags), smem);
    case DType::kHalf: return allow_smem(dense_kernel_for<__half>(p.flags), smem);
    case DType::kBFloat16: return allow_smem(dense_kernel_for<__nv_bfloat16>(p.flags), smem);
  }
  return cudaErrorInvalidValue;
}

cudaError_t prepare_strided(DType d, const Params& p, int threads) {
  const size_t smem = dyn_smem_bytes(p, threads);
  switch (d) {
    case DType::kFloat: return allow_smem(strided_kernel<float>, smem);
    case DType::kDouble: return allow_smem(strided_kernel<double>, smem);
    case DType::kHalf: return allow_smem(strided_kernel<__half>, smem);
    case DType::kBFloat16: return allow_smem(strided_kernel<__nv_bfloat16>, smem);
  }
  return cudaErrorInvalidValue;
}

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
