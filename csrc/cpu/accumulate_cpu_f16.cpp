// accumulate_cpu_f16.cpp -- the CPU kernel for float16 inputs: one dtype a file, so the four compile in parallel.
#include "accumulate_cpu_kernel.h"

namespace hookstats {
namespace cpu {
template void accumulate_typed<c10::Half>(const c10::Half* x, int64_t n, const Params& p, double* fs, int64_t* is);
}  // namespace cpu
}  // namespace hookstats
