// accumulate_cpu_bf16.cpp -- the CPU kernel for bfloat16 inputs: one dtype a file, so the four compile in parallel.
#include "accumulate_cpu_kernel.h"

namespace hookstats {
namespace cpu {
template void accumulate_typed<c10::BFloat16>(const c10::BFloat16* x, int64_t n, const Params& p, double* fs,
                                               int64_t* is);
}  // namespace cpu
}  // namespace hookstats
