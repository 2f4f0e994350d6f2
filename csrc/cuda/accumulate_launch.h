// accumulate_launch.h -- what the ATen launcher (accumulate_cuda.cpp) needs from the kernels: the argument
// structures and planning (kernel_plan.h, plain C++) and the launch functions defined in accumulate_launch.cu.
#pragma once
#include <cuda_runtime_api.h>

#include "kernel_plan.h"

namespace hookstats {
namespace cuda_kernel {

enum class DType { kFloat, kDouble, kHalf, kBFloat16 };

struct LaunchConfig {
  int threads;
  cudaStream_t stream;
  const unsigned char* enabled;  // the 1-element enabled tensor on the device
  int enabled_bytes;
};

// What a launch needs set before it (more than 48 KB of dynamic shared memory allowed for its kernel): called
// for every launch of a call before the first, so a refusal (an older GPU) leaves every state as it was.
cudaError_t prepare_dense(DType d, const Params& p, int threads);
cudaError_t prepare_strided(DType d, const Params& p, int threads);
// Dense targets of one dtype; the grid is b.block_start[b.count] blocks. prepare_dense first.
cudaError_t launch_dense(DType d, const Batch& b, const Params& p, const LaunchConfig& c);
// One strided view over `grid` blocks. prepare_strided first.
cudaError_t launch_strided(DType d, const Target& t, const Strided& s, int grid, const Params& p,
                           const LaunchConfig& c);

}  // namespace cuda_kernel
}  // namespace hookstats
