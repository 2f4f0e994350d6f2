"""Routes accumulate_ to the compiled op or the pure-PyTorch reference.

The gate runs once at import. HOOKSTATS_BACKEND=reference (run time) forces the reference and builds
nothing. Otherwise the op comes from hookstats/_C when the install built it ahead of time (setup.py with
torch importable: scripts/install.sh, `pip install --no-build-isolation`), else it is compiled on first import
and cached (hookstats/_build.py); if that cannot be done, the reference runs, with one warning that says why
and how to fix it. The fake kernel lets torch.compile trace a hook that calls the op (it mutates its state
arguments and returns nothing).
"""
import importlib.util
import os
import sys
import warnings

import torch

from . import _build, reference


def _load_extension():
    choice = os.environ.get("HOOKSTATS_BACKEND", "auto")
    if choice not in ("auto", "reference", "compiled"):
        raise ValueError(f"HOOKSTATS_BACKEND must be 'auto', 'reference' or 'compiled', got {choice!r}")
    if choice == "reference":
        return False
    try:
        if importlib.util.find_spec(f"{__package__}._C") is not None:
            from . import _C  # noqa: F401  (loading the library registers torch.ops.hookstats)
        else:
            _build.load_on_first_use()
        return True
    except _build.NotBuilt as e:
        reason, fix = e.args
    except Exception as e:  # noqa: BLE001  (a monitor must not break the import of the user's script)
        reason, fix = f"{type(e).__name__}: {e}", "reinstall hookstats (scripts/install.sh builds it ahead of time)"
    if choice == "compiled":
        raise ImportError(f"HOOKSTATS_BACKEND=compiled, but the fused C++/CUDA op is not available: {reason}. "
                          f"To get it: {fix}.")
    warnings.warn(f"hookstats: the fused C++/CUDA op is not available: {reason}. Using the slower pure-PyTorch "
                  f"reference path. To get the op: {fix}. HOOKSTATS_BACKEND=reference selects the reference path "
                  f"without this warning.", RuntimeWarning, stacklevel=3)
    return False


_COMPILED = _load_extension()

if _COMPILED:
    # The fake kernels (also the meta kernels) raise the op's errors: a meta x with CPU state is no silent no-op.
    @torch.library.register_fake("hookstats::accumulate_")
    def _accumulate_fake(x, fstate, istate, scratch, enabled, params):
        reference.check_args(x, fstate, istate, scratch, enabled, params, memory=False)

    @torch.library.register_fake("hookstats::accumulate_many_")
    def _accumulate_many_fake(xs, fstates, istates, scratches, enabled, params):
        reference.check_many_args(xs, fstates, istates, scratches, enabled, params, memory=False)

    @torch.library.register_fake("hookstats::order_states")
    def _order_states_fake(fstates):
        pass

    # The dispatcher routes a sparse, quantized, nested or MKL-DNN tensor to its own backend, where the op has no
    # kernel ("Could not run ... from the 'SparseCPU' backend"): these kernels raise the op's own error instead.
    _other_kinds = torch.library.Library("hookstats", "IMPL")
    for _key in ("SparseCPU", "SparseCUDA", "SparseCsrCPU", "SparseCsrCUDA", "QuantizedCPU", "QuantizedCUDA",
                 "NestedTensorCPU", "NestedTensorCUDA", "AutogradNestedTensor", "MkldnnCPU"):
        _other_kinds.impl("accumulate_", reference.check_args, _key)
        _other_kinds.impl("accumulate_many_", reference.check_many_args, _key)

    _one = torch.ops.hookstats.accumulate_.default
    _many = torch.ops.hookstats.accumulate_many_.default

    # torch.func.vmap (per-sample gradients, model ensembles) hands the hooks batched tensors, which have no data
    # of their own: the op reads the physical tensor, every sample's values, as a batched forward gives them
    if hasattr(torch.library, "register_vmap"):  # torch >= 2.4
        @torch.library.register_vmap("hookstats::accumulate_")
        def _accumulate_vmap(info, in_dims, x, fstate, istate, scratch, enabled, params):
            _one(x, fstate, istate, scratch, enabled, params)
            return None, None

    def _naming(op, check):
        """op, whose error for a None argument names it (torch's schema check of a None in a list is many lines);
        the op checks before it writes, so no state changed."""
        def call(*args, **kwargs):
            if torch.compiler.is_compiling():  # the fake kernel checks the arguments while tracing
                return op(*args, **kwargs)
            try:
                op(*args, **kwargs)
            except RuntimeError:
                check(*args, **kwargs)
                raise
        return call

    accumulate_ = _naming(_one, reference.check_types)
    accumulate_.__doc__ = "The op on one tensor: updates fstate, istate in place (``reference.accumulate_`` is the same in PyTorch)."
    accumulate_many_ = _naming(_many, reference.check_many_types)
    accumulate_many_.__doc__ = "The op on many tensors in one call, each with its own states (``reference.accumulate_many_``)."
    # The eager hooks' entry to the same op (csrc/ops.cpp): present when hookstats._C was imported as a module
    # (the ahead-of-time build); the build on first use loads the library only, and its hooks take torch.ops.
    _C = sys.modules.get(f"{__package__}._C")
    accumulate_eager_ = getattr(_C, "accumulate_eager", None)
else:
    accumulate_ = reference.accumulate_
    accumulate_many_ = reference.accumulate_many_
    accumulate_eager_ = None
COMPILED_OP = accumulate_ if _COMPILED else None  # accumulate_eager_ runs only while accumulate_ is still this


def backend():
    """'compiled' when the fused C++/CUDA op runs, 'reference' for the pure-PyTorch path."""
    return "compiled" if _COMPILED else "reference"


def has_cuda_kernel():
    return _COMPILED and torch._C._dispatch_has_kernel_for_dispatch_key("hookstats::accumulate_", "CUDA")


def order_states(fstates):
    """Orders torch's work on these states, queued next on the current stream, after the op's launches on them
    from any other stream (csrc/cuda/stream_order.h): call it before reading or writing states outside the op.
    Only CUDA states of a build with the CUDA kernel take part; anything else needs no order."""
    by_device = {}
    for f in fstates:
        if f.is_cuda:
            by_device.setdefault(f.device, []).append(f)
    if by_device and _COMPILED and torch._C._dispatch_has_kernel_for_dispatch_key("hookstats::order_states", "CUDA"):
        for fs in by_device.values():
            torch.ops.hookstats.order_states(fs)
