// ops.cpp -- the op schemas (once, for every device) and the Python module that loads them (with the eager hooks' entry).
// Kernels register themselves beside their code: cpu/accumulate_cpu.cpp, cuda/accumulate_cuda.cpp.
#include <Python.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/library.h>

#include "accumulator.h"
#include "check_args.h"

namespace {

using AccumulateFn = void(const at::Tensor&, at::Tensor&, at::Tensor&, at::Tensor&, const at::Tensor&,
                          c10::ArrayRef<double>);

// accumulate_eager(x, fstate, istate, scratch, enabled, params) -> bool: the eager hooks' entry to
// hookstats::accumulate_. torch.ops converts each argument to an IValue and calls the boxed kernel
// (~2.5 us a call, 80% of it in that conversion); this calls the same dispatcher entry unboxed, so modes, the
// profiler and autograd see the same op. It takes only a plain x (torch.Tensor or Parameter, dense layout, one of
// the op's dtypes, on the state's device) and params as a tuple of OpParams::kFields Python floats
// (StatsConfig.op_params()), with no __torch_function__ mode active; for anything else it returns False and
// changes nothing, and the caller takes torch.ops' path (which raises the op's error for a bad params).
PyObject* accumulate_eager(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 6) {
    PyErr_Format(PyExc_TypeError, "accumulate_eager takes 6 arguments, got %zd", nargs);
    return nullptr;
  }
  for (int i = 0; i < 5; ++i) {
    if (!THPVariable_CheckExact(args[i])) Py_RETURN_FALSE;
  }
  if (at::impl::torch_function_mode_enabled()) Py_RETURN_FALSE;
  const at::Tensor& x = THPVariable_Unpack(args[0]);
  const at::Tensor& fstate = THPVariable_Unpack(args[1]);
  const auto t = x.scalar_type();
  if (x.is_nested() || x.layout() != at::kStrided || x.device() != fstate.device() ||
      !(t == at::kFloat || t == at::kBFloat16 || t == at::kHalf || t == at::kDouble)) {
    Py_RETURN_FALSE;
  }
  PyObject* const py_params = args[5];
  if (!PyTuple_CheckExact(py_params) || PyTuple_GET_SIZE(py_params) != hookstats::OpParams::kFields) Py_RETURN_FALSE;
  double params[hookstats::OpParams::kFields];
  for (int k = 0; k < hookstats::OpParams::kFields; ++k) {
    PyObject* v = PyTuple_GET_ITEM(py_params, k);
    if (!PyFloat_CheckExact(v)) Py_RETURN_FALSE;
    params[k] = PyFloat_AS_DOUBLE(v);
  }
  at::Tensor istate = THPVariable_Unpack(args[2]), scratch = THPVariable_Unpack(args[3]), fs = fstate;
  const at::Tensor& enabled = THPVariable_Unpack(args[4]);
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("hookstats::accumulate_", "").typed<AccumulateFn>();
  // Below autograd: the op returns nothing and its states never require grad (check_args.h), so the autograd
  // fallback would only build and drop a node for an x that requires grad (a module's output: ~0.5 us a call).
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  if (x.numel() >= (int64_t(1) << 15)) {  // as torch.ops does, other Python threads run meanwhile
    pybind11::gil_scoped_release no_gil;
    op.call(x, fs, istate, scratch, enabled, params);
  } else {  // the GIL's hand-over would cost more than the op
    op.call(x, fs, istate, scratch, enabled, params);
  }
  Py_RETURN_TRUE;
  END_HANDLE_TH_ERRORS
}

PyMethodDef methods[] = {
    {"accumulate_eager", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(accumulate_eager)), METH_FASTCALL,
     "hookstats::accumulate_ for a plain eager x; False when x needs torch.ops' path."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

// `import hookstats._C` loads this library, so the TORCH_LIBRARY blocks run (the ops are reached through
// torch.ops.hookstats), and gives the eager hooks their entry (accumulate_eager).
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, methods};
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
  // histograms are not counted in this call (accumulator.h). params: the scalars (lo, inv_w, eps, nbins, flags), one
  // float list built once per configuration (StatsConfig.op_params()), decoded by OpParams::from (check_args.h);
  // flags: Flags in accumulator.h.
  m.def(
      "accumulate_(Tensor x, Tensor(a!) fstate, Tensor(b!) istate, Tensor(c!) scratch, Tensor enabled, "
      "float[] params) -> ()");
  // The same for a list of tensors, each with its own state, in one launch where the device allows.
  m.def(
      "accumulate_many_(Tensor[] xs, Tensor(a!)[] fstates, Tensor(b!)[] istates, Tensor(c!)[] scratches, "
      "Tensor enabled, float[] params) -> ()");
  // Bytes of scratch a state on this CUDA device needs (ticket + one partial per block); its kernel is in
  // cuda/accumulate_cuda.cpp, so a build without CUDA has the schema and no kernel.
  m.def("cuda_scratch_bytes(int device_index) -> int");
  // Orders torch's own work on these states (the current stream) after the op's launches on them from any other
  // stream; a no-op on the CPU. fstates: the states' fstate tensors, one device.
  m.def("order_states(Tensor[] fstates) -> ()");
  m.def("layout() -> int[]", &layout);
  m.def("istate_offsets(int nbins, int flags) -> int[]", &istate_offsets);
  m.def("cpu_kernel() -> str", &cpu_kernel);
}

}  // namespace hookstats
