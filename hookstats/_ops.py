"""Routes accumulate_ to the compiled op (hookstats._C) or the pure-PyTorch reference.

The gate runs once at import: HOOKSTATS_BACKEND=reference forces the reference; a missing extension
falls back to it with one warning that says how to build it. The fake kernel lets torch.compile trace
a hook that calls the op (it mutates its state arguments and returns nothing).
"""
import os
import warnings

import torch

from . import reference

_BUILD_HINT = "build it with `pip install --no-build-isolation -e .` (needs a C++ compiler and ninja)"


def _load_extension():
    choice = os.environ.get("HOOKSTATS_BACKEND", "auto")
    if choice not in ("auto", "reference", "compiled"):
        raise ValueError(f"HOOKSTATS_BACKEND must be 'auto', 'reference' or 'compiled', got {choice!r}")
    if choice == "reference":
        return False
    try:
        from . import _C  # noqa: F401  (loading the library registers torch.ops.hookstats)
    except ImportError as e:
        if choice == "compiled":
            raise ImportError(f"HOOKSTATS_BACKEND=compiled but hookstats._C is not built: {_BUILD_HINT}") from e
        warnings.warn(f"hookstats: the compiled extension is not available ({e}); using the slower pure-PyTorch "
                      f"reference path. To use the fused op, {_BUILD_HINT}.", RuntimeWarning, stacklevel=3)
        return False
    return True


_COMPILED = _load_extension()

if _COMPILED:
    # The fake kernels (also the meta kernels) raise the op's errors: a meta x with CPU state is no silent no-op.
    @torch.library.register_fake("hookstats::accumulate_")
    def _accumulate_fake(x, fstate, istate, scratch, enabled, lo, inv_w, eps, nbins, flags):
        reference.check_args(x, fstate, istate, scratch, enabled, lo, inv_w, eps, nbins, flags, memory=False)

    @torch.library.register_fake("hookstats::accumulate_many_")
    def _accumulate_many_fake(xs, fstates, istates, scratches, enabled, lo, inv_w, eps, nbins, flags):
        reference.check_many_args(xs, fstates, istates, scratches, enabled, lo, inv_w, eps, nbins, flags, memory=False)

    accumulate_ = torch.ops.hookstats.accumulate_.default
    accumulate_many_ = torch.ops.hookstats.accumulate_many_.default
else:
    accumulate_ = reference.accumulate_
    accumulate_many_ = reference.accumulate_many_


def backend():
    """'compiled' when the fused C++/CUDA op runs, 'reference' for the pure-PyTorch path."""
    return "compiled" if _COMPILED else "reference"


def has_cuda_kernel():
    return _COMPILED and torch._C._dispatch_has_kernel_for_dispatch_key("hookstats::accumulate_", "CUDA")
