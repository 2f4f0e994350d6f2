// accumulate_cpu_f32.cpp -- the CPU kernel for float32 inputs: one dtype a file, so the four compile in parallel.
#include "accumulate_cpu_kernel.h"

namespace hookstats {
namespace cpu {
template void accumulate_typed<float>(const float* x, int64_t n, const Params& p, double* fs, int64_t* is);
}  // namespace cpu
}  // namespace hookstats
