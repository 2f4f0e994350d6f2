// ops.cpp -- the op schemas (once, for every device) and the empty Python module that loads them.
// Kernels register themselves beside their code: cpu/accumulate_cpu.cpp, cuda/accumulate_cuda.cu.
#include <Python.h>
#include <torch/library.h>

#include "accumulator.h"

// `import hookstats._C` only has to load this library so the TORCH_LIBRARY blocks run;
// the ops are then reached through torch.ops.hookstats.
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}

namespace hookstats {

std::string cpu_kernel();  // cpu/accumulate_cpu.cpp: "avx512", "avx2" or "portable" (HOOKSTATS_CPU_KERNEL)

std::vector<int64_t> layout() {
  return {kFState, kLinBase, kLinExtra, kLogSlots, kLogExpMin, kMaxBins,
          kFloatHist, kFloatMantBits, kFloatSlots, kFloatBelow, kFloatAbove, kFloatZero, kSkipHist};
}

// The istate offsets of (nbins, flags), for hookstats/layout.py's mirror test.
std::vector<int64_t> istate_offsets(int64_t nbins, int64_t flags) {
  const int nb = static_cast<int>(nbins), fl = static_cast<int>(flags);
  return {kept_first(nb, fl), nonfinite_base(nb, fl), log_base(nb, fl), float_base(nb, fl), istate_size(nb, fl)};
}

TORCH_LIBRARY(hookstats, m) {
  // Updates the running state of one target in place with the statistics of x, in one read of x.
  // enabled: a 1-element bool/int tensor on x's device, read there without a host sync (so sampling works inside
  // captured graphs): 0 makes the call a no-op; any other value runs it, and with bit kSkipHist (2) set the
  // histograms are not counted in this call (accumulator.h). flags: Flags in accumulator.h.
  m.def(
      "accumulate_(Tensor x, Tensor(a!) fstate, Tensor(b!) istate, Tensor(c!) scratch, Tensor enabled, "
      "float lo, float inv_w, float eps, int nbins, int flags) -> ()");
  // The same for a list of tensors, each with its own state, in one launch where the device allows.
  m.def(
      "accumulate_many_(Tensor[] xs, Tensor(a!)[] fstates, Tensor(b!)[] istates, Tensor(c!)[] scratches, "
      "Tensor enabled, float lo, float inv_w, float eps, int nbins, int flags) -> ()");
  // Bytes of scratch a state on this CUDA device needs (ticket + one partial per block); its kernel is in
  // cuda/accumulate_cuda.cu, so a build without CUDA has the schema and no kernel.
  m.def("cuda_scratch_bytes(int device_index) -> int");
  m.def("layout() -> int[]", &layout);
  m.def("istate_offsets(int nbins, int flags) -> int[]", &istate_offsets);
  m.def("cpu_kernel() -> str", &cpu_kernel);
}

}  // namespace hookstats
