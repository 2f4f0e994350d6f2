// accumulate_cpu_typed.h -- what the CPU op's dispatch (accumulate_cpu.cpp) needs of its kernel: which vector kernel
// runs, and the per-dtype entry point, defined in accumulate_cpu_kernel.h and instantiated once per dtype in
// accumulate_cpu_f32.cpp, accumulate_cpu_f64.cpp, accumulate_cpu_f16.cpp and accumulate_cpu_bf16.cpp.
#pragma once
#include <cstdint>

#include "../accumulator.h"

namespace hookstats {
namespace cpu {

// The fastest kernel the CPU has (AVX-512 serves the op without linear/log2 histograms, AVX2 the rest);
// HOOKSTATS_CPU_KERNEL=portable, avx2 or avx512 forces one where the CPU has it (cpu_kernel() says which runs).
enum class Kernel { kPortable, kAvx2, kAvx512 };
Kernel kernel_in_use();

// Accumulates x[0, n) (dense, in memory order) into fs/is under p; float, double, c10::Half, c10::BFloat16.
template <typename T>
void accumulate_typed(const T* x, int64_t n, const Params& p, double* fs, int64_t* is);

}  // namespace cpu
}  // namespace hookstats
