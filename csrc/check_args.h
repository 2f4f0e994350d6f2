// check_args.h -- argument checks shared by every device's launcher: errors name the bad argument.
#pragma once
#include <ATen/ATen.h>

#include "accumulator.h"

namespace hookstats {

inline void check_accumulate_args(const at::Tensor& x, const at::Tensor& fstate, const at::Tensor& istate,
                                  const at::Tensor& enabled, int64_t nbins, int64_t flags) {
  const auto t = x.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16,
              "hookstats.accumulate_: x must be float32, float64, float16 or bfloat16, got ", t);
  TORCH_CHECK(nbins >= 1 && nbins <= kMaxBins, "hookstats.accumulate_: nbins must be in [1, ", kMaxBins,
              "], got ", nbins);
  TORCH_CHECK(flags >= 0 && flags < 8, "hookstats.accumulate_: unknown flags ", flags);
  TORCH_CHECK(fstate.scalar_type() == at::kDouble && fstate.numel() == kFState && fstate.is_contiguous(),
              "hookstats.accumulate_: fstate must be a contiguous float64 tensor of ", kFState, " elements");
  TORCH_CHECK(istate.scalar_type() == at::kLong && istate.numel() == istate_size(nbins) && istate.is_contiguous(),
              "hookstats.accumulate_: istate must be a contiguous int64 tensor of ", istate_size(nbins),
              " elements for nbins=", nbins, ", got ", istate.numel());
  TORCH_CHECK(enabled.numel() == 1, "hookstats.accumulate_: enabled must have one element");
  TORCH_CHECK(fstate.device() == x.device() && istate.device() == x.device() && enabled.device() == x.device(),
              "hookstats.accumulate_: x, fstate, istate and enabled must be on one device; x is on ", x.device(),
              ", fstate on ", fstate.device(), ", istate on ", istate.device(), ", enabled on ", enabled.device());
}

inline void check_many_sizes(at::TensorList xs, at::TensorList fstates, at::TensorList istates,
                             at::TensorList scratches) {
  TORCH_CHECK(xs.size() == fstates.size() && xs.size() == istates.size() && xs.size() == scratches.size(),
              "hookstats.accumulate_many_: xs, fstates, istates and scratches must have equal lengths, got ",
              xs.size(), ", ", fstates.size(), ", ", istates.size(), ", ", scratches.size());
}

inline Params make_params(double lo, double inv_w, double eps, int64_t nbins, int64_t flags) {
  return Params{static_cast<float>(lo), static_cast<float>(inv_w), static_cast<float>(eps),
                static_cast<int>(nbins), static_cast<int>(flags)};
}

}  // namespace hookstats
