// check_args.h -- argument checks shared by every device's launcher; hookstats/reference.py (check_args)
// raises the same errors, so the fallback fails where the op fails. One error per bad argument, naming it.
// Every argument of a call is checked before any state changes.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

#include "accumulator.h"

namespace hookstats {

// Where an error is: accumulate_ (k < 0) or entry k of accumulate_many_'s lists. Messages are only built on failure.
struct Op {
  int64_t k;
};
inline std::ostream& operator<<(std::ostream& o, const Op& op) {
  return op.k < 0 ? o << "hookstats.accumulate_: " : o << "hookstats.accumulate_many_: target[" << op.k << "]: ";
}

// A state the op updates in place: on x's device, of its dtype and size, contiguous, and writable in place.
// size_note says what the size depends on (" for nbins=40"); built only on failure.
template <typename Note>
inline void check_state(Op op, const char* name, const at::Tensor& t, at::ScalarType dtype, const char* dtype_name,
                        int64_t numel, const Note& size_note, const at::Tensor& x) {
  TORCH_CHECK(t.device() == x.device(), op, name, " must be on x's device (", x.device(), "), got ", t.device());
  TORCH_CHECK(t.scalar_type() == dtype, op, name, " must be ", dtype_name, ", got ", t.scalar_type());
  TORCH_CHECK(numel < 0 || t.numel() == numel, op, name, " must have ", numel, " elements", size_note(), ", got ",
              t.numel());
  TORCH_CHECK(t.is_contiguous(), op, name, " must be contiguous");
  TORCH_CHECK(!t.requires_grad(), op, name, " must not require grad: the op updates it in place");
  TORCH_CHECK(!t.is_inference() || c10::InferenceMode::is_enabled(), op, name,
              " is an inference tensor, which cannot be updated outside torch.inference_mode(): create the state "
              "outside inference mode");
}

// The op's scalar arguments, passed as its one `float[] params` argument (lo, inv_w, eps, nbins, flags; built once
// per configuration by StatsConfig.op_params()): a new scalar is one field here and in hookstats/reference.py
// (_params). Every field fits a float64 exactly (nbins and flags are small integers). from() is the one place
// the fields are decoded and checked; a malformed params raises one error naming the field.
struct OpParams {
  static constexpr int kFields = 5;
  double lo, inv_w, eps;
  int64_t nbins, flags;

  static OpParams from(const char* op, c10::ArrayRef<double> p) {
    TORCH_CHECK(p.size() == kFields, op, "params must have ", kFields, " fields (lo, inv_w, eps, nbins, flags), got ",
                p.size(), ": build it with StatsConfig.op_params()");
    const double nb = p[3], fl = p[4];
    // compared as doubles first: a NaN or huge field must not reach an integer cast
    TORCH_CHECK(nb >= 1 && nb <= kMaxBins && nb == std::floor(nb), op, "nbins must be in [1, ", kMaxBins, "], got ",
                nb);
    TORCH_CHECK(fl >= 0 && fl < 16 && fl == std::floor(fl), op, "unknown flags ", fl);
    // The kernels bin with float32 lo and inv_w (accumulator.h Params): they must be finite there.
    const double lo = p[0], inv_w = p[1], eps = p[2];
    const float lo32 = static_cast<float>(lo), inv_w32 = static_cast<float>(inv_w), eps32 = static_cast<float>(eps);
    TORCH_CHECK(std::isfinite(lo32), op, "lo must be finite in float32, got ", lo);
    TORCH_CHECK(std::isfinite(inv_w32) && inv_w32 > 0.0f, op,
                "inv_w (nbins / (hi - lo)) must be finite and > 0 in float32, got ", inv_w);
    TORCH_CHECK(eps32 >= 0.0f, op, "eps must be >= 0, got ", eps);
    return OpParams{lo, inv_w, eps, static_cast<int64_t>(nb), static_cast<int64_t>(fl)};
  }

  // What the kernels take (by value, also into a CUDA launch).
  Params kernel() const {
    return Params{static_cast<float>(lo), static_cast<float>(inv_w), static_cast<float>(eps),
                  static_cast<int>(nbins), static_cast<int>(flags), static_cast<int>(flags)};
  }
};

// The flags are said where they decide istate's size: FLOAT_HIST is on, or the state has the size other flags give.
inline std::string istate_note(int nbins, int flags, const at::Tensor& istate) {
  bool flags_matter = flags & kFloatHist;
  for (int other = 0; other < 16 && !flags_matter; ++other) flags_matter = istate.numel() == istate_size(nbins, other);
  return " for nbins=" + std::to_string(nbins) + (flags_matter ? ", flags=" + std::to_string(flags) : std::string());
}

inline void check_target(Op op, const at::Tensor& x, const at::Tensor& fstate, const at::Tensor& istate,
                         const at::Tensor& scratch, const at::Tensor& enabled, int64_t nbins, int64_t flags) {
  // None passed for a Tensor argument arrives as an undefined tensor: name it before anything asks its device
  const std::pair<const char*, const at::Tensor*> args[] = {
      {"x", &x}, {"fstate", &fstate}, {"istate", &istate}, {"scratch", &scratch}, {"enabled", &enabled}};
  for (const auto& [name, t] : args) TORCH_CHECK(t->defined(), op, name, " must be a tensor, got None");
  const auto t = x.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16,
              op, "x must be float32, float64, float16 or bfloat16, got ", t);
  const int nb = static_cast<int>(nbins), fl = static_cast<int>(flags);
  const auto no_note = [] { return std::string(); };
  check_state(op, "fstate", fstate, at::kDouble, "float64", kFState, no_note, x);
  check_state(op, "istate", istate, at::kLong, "int64", istate_size(nb, fl),
              [&] { return istate_note(nb, fl, istate); }, x);
  check_state(op, "scratch", scratch, at::kByte, "uint8", -1, no_note, x);
  TORCH_CHECK(enabled.device() == x.device(), op, "enabled must be on x's device (", x.device(), "), got ",
              enabled.device());
  const auto e = enabled.scalar_type();
  TORCH_CHECK(e == at::kBool || e == at::kByte || e == at::kInt || e == at::kLong,
              op, "enabled must be bool, uint8, int32 or int64 (0: off; else on, without the histograms where bit 2 "
              "is set), got ", e);
  TORCH_CHECK(enabled.numel() == 1, op, "enabled must have one element, got ", enabled.numel());
}

// x's data pointer a multiple of its element size. Only external memory (DLPack, from_blob, frombuffer at an odd
// byte offset) breaks it; the kernels' element loads from such a pointer fault on a GPU and kill the CUDA context.
inline void check_aligned(Op op, const at::Tensor& x) {
  TORCH_CHECK(x.numel() == 0 || reinterpret_cast<uintptr_t>(x.const_data_ptr()) % x.element_size() == 0, op,
              "x's data pointer is not a multiple of its ", x.element_size(), "-byte element size (external memory at "
              "an odd byte offset): pass a copy (x.clone())");
}

// No state may share memory with another state or with an x (of any entry of a list): an update would
// change what another update or the read of x sees. xs may share memory with each other (they are only read).
struct Extent {
  uintptr_t begin, end;
  int64_t k;  // entry of the list (-1 for accumulate_)
  int what;   // kNames index: 0 is x, the rest are states
};
constexpr const char* kNames[] = {"x", "fstate", "istate", "scratch"};

// The extents of one call, without a heap allocation.
template <int N>
struct FixedExtents {
  Extent items[N];
  int n = 0;
  void push_back(const Extent& e) { items[n++] = e; }
  Extent* begin() { return items; }
  Extent* end() { return items + n; }
};

// By start address. A few fixed extents: insertion (std::sort's unrolled paths for 16+ items made gcc warn of
// out-of-bounds reads on a 4-item array that no n <= 4 reaches).
inline bool starts_before(const Extent& a, const Extent& b) { return a.begin < b.begin; }
template <int N>
inline void sort_extents(FixedExtents<N>& ext) {
  for (int i = 1; i < ext.n; ++i) {
    for (int j = i; j > 0 && starts_before(ext.items[j], ext.items[j - 1]); --j) {
      std::swap(ext.items[j], ext.items[j - 1]);
    }
  }
}
inline void sort_extents(std::vector<Extent>& ext) { std::sort(ext.begin(), ext.end(), starts_before); }

inline std::string extent_name(const Extent& e) {
  return e.k < 0 ? kNames[e.what] : std::string(kNames[e.what]) + " of target[" + std::to_string(e.k) + "]";
}
template <typename Extents>
inline void add_extents(Extents& out, int64_t k, std::initializer_list<const at::Tensor*> ts) {
  int what = 0;
  for (const at::Tensor* t : ts) {
    if (t->numel() > 0) {
      int64_t last = 0;  // offset of the last element; torch strides are >= 0
      for (int64_t d = 0; d < t->dim(); ++d) last += (t->size(d) - 1) * t->stride(d);
      const auto begin = reinterpret_cast<uintptr_t>(t->const_data_ptr());
      out.push_back({begin, begin + static_cast<uintptr_t>((last + 1) * t->element_size()), k, what});
    }
    ++what;
  }
}
template <typename Extents>
inline void check_no_overlap(const char* op, Extents& ext) {
  sort_extents(ext);
  const Extent* far_any = nullptr;    // of the extents so far, the one reaching furthest
  const Extent* far_state = nullptr;  // the same among states
  for (const Extent& e : ext) {
    const Extent* other = e.what ? far_any : far_state;
    TORCH_CHECK(!other || e.begin >= other->end, op, extent_name(e), " and ", extent_name(*other),
                " share memory: every state needs tensors of its own, apart from x");
    if (!far_any || e.end > far_any->end) far_any = &e;
    if (e.what && (!far_state || e.end > far_state->end)) far_state = &e;
  }
}

// Both return the decoded params for the kernels.
inline Params check_one_call(const at::Tensor& x, const at::Tensor& fstate, const at::Tensor& istate,
                             const at::Tensor& scratch, const at::Tensor& enabled, c10::ArrayRef<double> params) {
  const OpParams a = OpParams::from("hookstats.accumulate_: ", params);
  check_target(Op{-1}, x, fstate, istate, scratch, enabled, a.nbins, a.flags);
  check_aligned(Op{-1}, x);
  FixedExtents<4> ext;  // on the stack: a heap vector was a tenth of a small tensor's call
  add_extents(ext, -1, {&x, &fstate, &istate, &scratch});
  check_no_overlap("hookstats.accumulate_: ", ext);
  return a.kernel();
}

inline Params check_many_call(at::TensorList xs, at::TensorList fstates, at::TensorList istates,
                              at::TensorList scratches, const at::Tensor& enabled, c10::ArrayRef<double> params) {
  const char* op = "hookstats.accumulate_many_: ";
  TORCH_CHECK(xs.size() == fstates.size() && xs.size() == istates.size() && xs.size() == scratches.size(),
              op, "xs, fstates, istates and scratches must have equal lengths, got ", xs.size(), ", ",
              fstates.size(), ", ", istates.size(), ", ", scratches.size());
  const OpParams a = OpParams::from(op, params);
  std::vector<Extent> ext;
  ext.reserve(4 * xs.size());
  for (size_t k = 0; k < xs.size(); ++k) {
    const auto i = static_cast<int64_t>(k);
    check_target(Op{i}, xs[k], fstates[k], istates[k], scratches[k], enabled, a.nbins, a.flags);
    add_extents(ext, i, {&xs[k], &fstates[k], &istates[k], &scratches[k]});
  }
  for (size_t k = 0; k < xs.size(); ++k) check_aligned(Op{static_cast<int64_t>(k)}, xs[k]);
  check_no_overlap(op, ext);
  return a.kernel();
}

}  // namespace hookstats
