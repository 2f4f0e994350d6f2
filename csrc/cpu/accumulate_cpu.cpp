// accumulate_cpu.cpp -- the CPU kernel of hookstats::accumulate_ and its registration: reads the enabled flag,
// makes the input dense and dispatches on its dtype to the kernel (accumulate_cpu_kernel.h, one file per dtype).
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "../accumulator.h"
#include "../check_args.h"
#include "accumulate_cpu_typed.h"

namespace hookstats {
namespace cpu {

Kernel kernel_in_use() {
  static const Kernel k = [] {
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    const std::string want = std::getenv("HOOKSTATS_CPU_KERNEL") ? std::getenv("HOOKSTATS_CPU_KERNEL") : "";
    if (want == "portable") return Kernel::kPortable;
    if (want == "avx2" && avx2) return Kernel::kAvx2;
    return avx512 ? Kernel::kAvx512 : avx2 ? Kernel::kAvx2 : Kernel::kPortable;
  }();
  return k;
}

}  // namespace cpu

namespace {

// Reads the 1-element enabled flag straight from CPU memory (no dispatch, so no .item()): 0 off, else its low bits
// (kSkipHist among them), nonzero whenever the value is.
int enabled_value(const at::Tensor& e) {
  const auto low = [](int64_t v) { return v == 0 ? 0 : static_cast<int>(v & 0xff) | 0x100; };
  switch (e.scalar_type()) {
    case at::kBool: return *e.const_data_ptr<bool>() ? 1 : 0;
    case at::kByte: return *e.const_data_ptr<uint8_t>();
    case at::kInt: return low(*e.const_data_ptr<int32_t>());
    case at::kLong: return low(*e.const_data_ptr<int64_t>());
    default: TORCH_CHECK(false, "unreachable: check_args.h checks enabled's dtype");
  }
}

// x and its state were checked (check_args.h).
void accumulate_checked(const at::Tensor& x, at::Tensor& fstate, at::Tensor& istate, const at::Tensor& enabled,
                        Params p) {
  const int on = enabled_value(enabled);
  if (!on || x.numel() == 0) return;
  p.flags = call_flags(p.flags, on);  // kSkipHist: the template path without histograms
  // Dense layouts (contiguous, channels_last, permuted) are read in memory order with no copy;
  // the statistics do not depend on element order. Other views are copied once.
  const at::Tensor xs = x.is_non_overlapping_and_dense() ? x : x.contiguous();
  double* fs = fstate.data_ptr<double>();
  int64_t* is = istate.data_ptr<int64_t>();
  const int64_t n = xs.numel();
  switch (xs.scalar_type()) {
    case at::kFloat: cpu::accumulate_typed(xs.const_data_ptr<float>(), n, p, fs, is); break;
    case at::kDouble: cpu::accumulate_typed(xs.const_data_ptr<double>(), n, p, fs, is); break;
    case at::kHalf: cpu::accumulate_typed(xs.const_data_ptr<c10::Half>(), n, p, fs, is); break;
    case at::kBFloat16: cpu::accumulate_typed(xs.const_data_ptr<c10::BFloat16>(), n, p, fs, is); break;
    default: TORCH_CHECK(false, "unreachable");
  }
}

void accumulate_cpu(const at::Tensor& x, at::Tensor& fstate, at::Tensor& istate, at::Tensor& scratch,
                    const at::Tensor& enabled, c10::ArrayRef<double> params) {
  accumulate_checked(x, fstate, istate, enabled, check_one_call(x, fstate, istate, scratch, enabled, params));
}

// Every entry is checked before the first update, so a bad list changes no state.
void accumulate_many_cpu(at::TensorList xs, at::TensorList fstates, at::TensorList istates,
                         at::TensorList scratches, const at::Tensor& enabled, c10::ArrayRef<double> params) {
  const Params p = check_many_call(xs, fstates, istates, scratches, enabled, params);
  for (size_t k = 0; k < xs.size(); ++k) {
    at::Tensor f = fstates[k], i = istates[k];
    accumulate_checked(xs[k], f, i, enabled, p);
  }
}

}  // namespace

std::string cpu_kernel() {
  const cpu::Kernel k = cpu::kernel_in_use();
  return k == cpu::Kernel::kAvx512 ? "avx512" : k == cpu::Kernel::kAvx2 ? "avx2" : "portable";
}

TORCH_LIBRARY_IMPL(hookstats, CPU, m) {
  m.impl("accumulate_", &accumulate_cpu);
  m.impl("accumulate_many_", &accumulate_many_cpu);
  m.impl("order_states", [](at::TensorList) {});  // one stream on the CPU: nothing to order
}

}  // namespace hookstats
