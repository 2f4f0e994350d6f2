"""Pure-PyTorch accumulate_: the fallback when the extension is missing, and the oracle of the tests.

Same signature and state layout as the C++/CUDA op (csrc/accumulator.h). Moments are float64 two-pass
over the tensor; bins use the kernels' float32 formula; float buckets read the float32 bits (float64 inputs:
their exact magnitude, as accumulator.h's float_slot(double)). Runs on any device with no host sync: no
.item(), no bincount, no range-inferring histc; `enabled` masks the update on the device (0: none; with
layout.SKIP_HIST set: all but the histograms).
"""
import math
import numbers

import numpy as np
import torch
from torch._functorch.pyfunctorch import temporarily_clear_interpreter_stack

from . import layout, rawstate
from .tensors import MEASURED_DTYPES

_FLAG_DTYPES = (torch.bool, torch.uint8, torch.int32, torch.int64)
_F32_MAX = 3.4028234663852886e38


def _bin_values(x):
    """float32 values the kernels bin: float64 inputs keep huge values finite and tiny values nonzero."""
    if x.dtype != torch.float64:
        return x.float()
    f = x.clamp(-_F32_MAX, _F32_MAX).float()
    f = torch.where(torch.isinf(x), x.float(), f)
    tiny = torch.full_like(f, 1e-45).copysign(x.float())
    return torch.where((f == 0) & (x != 0), tiny, f)


def _log_slots(f):
    bits = f.abs().view(torch.int32)
    e = bits >> 23
    return torch.where(e == 0, (bits != 0).long(), e.long() + 1)


def _float_slots(x):
    """Float bucket of each finite value (accumulator.h float_slot); non-finite values get any slot."""
    if x.dtype != torch.float64:
        bits = x.float().view(torch.int32)
        slots = (bits >> layout.FLOAT_SHIFT) & (layout.FLOAT_SLOTS - 1)
        return torch.where((bits & 0x7FFFFFFF) == 0, layout.FLOAT_ZERO, slots).long()
    a = x.abs()
    f = a.float()  # round to nearest (past 2**128 - 2**103: inf); truncate toward zero by stepping back one ulp
    bits = f.view(torch.int32) - (f.double() > a).int()
    k = torch.where(a >= 2.0 ** 128, layout.FLOAT_ABOVE, torch.where(
        a < 2.0 ** -149, layout.FLOAT_BELOW, bits >> layout.FLOAT_SHIFT))
    k = torch.where(a == 0, layout.FLOAT_ZERO, k)
    return (k + torch.where(x < 0, layout.FLOAT_HALF, 0)).long()


def _f32(v):
    with np.errstate(over="ignore"):
        return float(np.float32(v))


def _params(op, params):
    """params decoded and checked as the op does (csrc/check_args.h OpParams::from): (lo, inv_w, eps, nbins, flags)."""
    if len(params) != len(layout.PARAM_FIELDS):
        raise RuntimeError(f"{op}params must have {len(layout.PARAM_FIELDS)} fields ({', '.join(layout.PARAM_FIELDS)}), got "
                           f"{len(params)}: build it with StatsConfig.op_params()")
    lo, inv_w, eps, nbins, flags = params
    if not (1 <= nbins <= layout.MAX_BINS and float(nbins).is_integer()):
        raise RuntimeError(f"{op}nbins must be in [1, {layout.MAX_BINS}], got {_g(nbins)}")
    if not (0 <= flags < 16 and float(flags).is_integer()):
        raise RuntimeError(f"{op}unknown flags {_g(flags)}")
    if not math.isfinite(_f32(lo)):
        raise RuntimeError(f"{op}lo must be finite in float32, got {lo}")
    if not (math.isfinite(_f32(inv_w)) and _f32(inv_w) > 0):
        raise RuntimeError(f"{op}inv_w (nbins / (hi - lo)) must be finite and > 0 in float32, got {inv_w}")
    if not _f32(eps) >= 0:
        raise RuntimeError(f"{op}eps must be >= 0, got {eps}")
    return lo, inv_w, eps, int(nbins), int(flags)


def _g(v):
    return f"{v:g}"  # as C++ prints a double: 40, 3.5, nan


_SPARSE = {torch.sparse_coo: "COO", torch.sparse_csr: "CSR", torch.sparse_csc: "CSC", torch.sparse_bsr: "BSR",
           torch.sparse_bsc: "BSC"}
TAKES = ("the op takes dense strided tensors only (torch.strided layout, not sparse, quantized, nested or MKL-DNN): "
         "x float32, float64, float16 or bfloat16; fstate float64, istate int64, scratch uint8; all on x's device, "
         "CPU or CUDA")


def kind_error(op, name, t):
    """The op's error for a tensor of a kind it does not read (also raised for the compiled op: accumulate.py
    registers it for the dispatch keys of those kinds), or None for a dense strided tensor."""
    if t.is_nested:
        kind, advice = "nested tensor", "measure its packed values, t.values()"
    elif t.is_quantized:
        kind, advice = "quantized tensor", "measure t.dequantize()"
    elif t.layout in _SPARSE:
        kind, advice = f"sparse {_SPARSE[t.layout]} tensor", "measure t.to_dense(), or its stored values t.values()"
    elif t.layout == torch._mkldnn:
        kind, advice = "mkldnn tensor", "measure t.to_dense()"
    elif t.layout != torch.strided:
        kind, advice = f"{t.layout} tensor", "measure a dense copy of it"
    else:
        return None
    return f"{op}{name} is a {kind}; {TAKES}. To measure it, {advice}"


def _check_kinds(op, tensors):
    for name, t in tensors:
        if (msg := kind_error(op, name, t)) is not None:
            raise RuntimeError(msg)


def _check_state(op, name, t, dtype, numel, x, size_note=""):
    if t.device != x.device:
        raise RuntimeError(f"{op}{name} must be on x's device ({x.device}), got {t.device}")
    if t.dtype != dtype:
        raise RuntimeError(f"{op}{name} must be {str(dtype).replace('torch.', '')}, got {t.dtype}")
    if numel is not None and t.numel() != numel:
        raise RuntimeError(f"{op}{name} must have {numel} elements{size_note}, got {t.numel()}")
    if not t.is_contiguous():
        raise RuntimeError(f"{op}{name} must be contiguous")
    if t.requires_grad:
        raise RuntimeError(f"{op}{name} must not require grad: the op updates it in place")
    if t.is_inference() and not torch.is_inference_mode_enabled():
        raise RuntimeError(f"{op}{name} is an inference tensor, which cannot be updated outside "
                           f"torch.inference_mode(): create the state outside inference mode")


def _istate_note(nbins, flags, istate):
    """Says the flags where they decide the size: FLOAT_HIST is on, or the state has the size other flags give."""
    other = istate.numel() != layout.istate_size(nbins, flags) and any(
        istate.numel() == layout.istate_size(nbins, g) for g in range(16))
    return f" for nbins={nbins}" + (f", flags={flags}" if flags & layout.FLOAT_HIST or other else "")


def _check_target(op, x, fstate, istate, scratch, enabled, nbins, flags):
    _check_kinds(op, (("x", x), ("fstate", fstate), ("istate", istate), ("scratch", scratch), ("enabled", enabled)))
    if x.dtype not in MEASURED_DTYPES:
        raise RuntimeError(f"{op}x must be float32, float64, float16 or bfloat16, got {x.dtype}")
    _check_state(op, "fstate", fstate, torch.float64, layout.FSTATE_SIZE, x)
    _check_state(op, "istate", istate, torch.int64, layout.istate_size(nbins, flags), x,
                 _istate_note(nbins, flags, istate))
    _check_state(op, "scratch", scratch, torch.uint8, None, x)
    if enabled.device != x.device:
        raise RuntimeError(f"{op}enabled must be on x's device ({x.device}), got {enabled.device}")
    if enabled.dtype not in _FLAG_DTYPES:
        raise RuntimeError(f"{op}enabled must be bool, uint8, int32 or int64 (0: off; else on, without the histograms "
                           f"where bit 2 is set), got {enabled.dtype}")
    if enabled.numel() != 1:
        raise RuntimeError(f"{op}enabled must have one element, got {enabled.numel()}")


def _check_aligned(op, x):
    """x's data pointer a multiple of its element size (only external memory at an odd byte offset breaks it)."""
    if x.numel() and x.device.type != "meta" and x.data_ptr() % x.element_size():
        raise RuntimeError(f"{op}x's data pointer is not a multiple of its {x.element_size()}-byte element size "
                           f"(external memory at an odd byte offset): pass a copy (x.clone())")


def _extents(k, tensors):
    """(begin, end, k, what) byte ranges of the tensors with data; what 0 is x, 1-3 are states."""
    out = []
    for what, t in enumerate(tensors):
        if t.numel() and t.device.type != "meta":
            last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
            out.append((t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size(), k, what))
    return out


def _check_no_overlap(op, extents):
    """No state shares memory with another state or with an x (xs may share memory: they are only read)."""
    names = ("x", "fstate", "istate", "scratch")
    name = lambda e: names[e[3]] if e[2] < 0 else f"{names[e[3]]} of target[{e[2]}]"  # noqa: E731
    far_any = far_state = None
    for e in sorted(extents, key=lambda e: e[0]):
        other = far_any if e[3] else far_state
        if other is not None and e[0] < other[1]:
            raise RuntimeError(f"{op}{name(e)} and {name(other)} share memory: every state needs tensors of its own, "
                               f"apart from x")
        if far_any is None or e[1] > far_any[1]:
            far_any = e
        if e[3] and (far_state is None or e[1] > far_state[1]):
            far_state = e


def check_types(x, fstate, istate, scratch, enabled, params):
    """accumulate_'s arguments are tensors and a list of numbers: one error naming the first that is not (None
    among them), before any other check reads a tensor's attributes."""
    op = "hookstats.accumulate_: "
    _check_tensors(op, (("x", x), ("fstate", fstate), ("istate", istate), ("scratch", scratch), ("enabled", enabled)))
    _check_params_type(op, params)


def check_many_types(xs, fstates, istates, scratches, enabled, params):
    """check_types for accumulate_many_: lists of tensors (an entry that is None named by its target index)."""
    op = "hookstats.accumulate_many_: "
    lists = (("xs", "x", xs), ("fstates", "fstate", fstates), ("istates", "istate", istates),
             ("scratches", "scratch", scratches))
    for name, _, v in lists:
        if not isinstance(v, (list, tuple)):
            raise RuntimeError(f"{op}{name} must be a list of tensors, got {_type_name(v)}")
    for name, one, v in lists:
        for k, t in enumerate(v):
            _check_tensors(f"{op}target[{k}]: ", ((one, t),))
    _check_tensors(op, (("enabled", enabled),))
    _check_params_type(op, params)


def _check_tensors(op, named):
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise RuntimeError(f"{op}{name} must be a tensor, got {_type_name(t)}")


def _check_params_type(op, params):
    if not isinstance(params, (list, tuple)) or not all(isinstance(v, numbers.Real) for v in params):
        raise RuntimeError(f"{op}params must be a list of {len(layout.PARAM_FIELDS)} numbers "
                           f"({', '.join(layout.PARAM_FIELDS)}): build it with StatsConfig.op_params(); got "
                           f"{_type_name(params)}")


def _type_name(v):
    return "None" if v is None else type(v).__name__


def check_args(x, fstate, istate, scratch, enabled, params, memory=True):
    """The errors of the compiled op (csrc/check_args.h) for accumulate_'s arguments; the decoded params.
    memory=False leaves out the shared-memory test (fake tensors have no memory)."""
    check_types(x, fstate, istate, scratch, enabled, params)
    op = "hookstats.accumulate_: "
    lo, inv_w, eps, nbins, flags = p = _params(op, params)
    _check_target(op, x, fstate, istate, scratch, enabled, nbins, flags)
    if memory and not torch.compiler.is_compiling():
        _check_aligned(op, x)
        _check_no_overlap(op, _extents(-1, (x, fstate, istate, scratch)))
    return p


def check_many_args(xs, fstates, istates, scratches, enabled, params, memory=True):
    """check_args for accumulate_many_: every entry, before any state changes."""
    check_many_types(xs, fstates, istates, scratches, enabled, params)
    op = "hookstats.accumulate_many_: "
    if not len(xs) == len(fstates) == len(istates) == len(scratches):
        raise RuntimeError(f"{op}xs, fstates, istates and scratches must have equal lengths, got {len(xs)}, "
                           f"{len(fstates)}, {len(istates)}, {len(scratches)}")
    lo, inv_w, eps, nbins, flags = p = _params(op, params)
    for k, (x, f, i, s) in enumerate(zip(xs, fstates, istates, scratches)):
        _check_target(f"{op}target[{k}]: ", x, f, i, s, enabled, nbins, flags)
    if memory and not torch.compiler.is_compiling():
        for k, x in enumerate(xs):
            _check_aligned(f"{op}target[{k}]: ", x)
        entries = enumerate(zip(xs, fstates, istates, scratches))
        _check_no_overlap(op, [e for k, ts in entries for e in _extents(k, ts)])
    return p


def accumulate_(x, fstate, istate, scratch, enabled, params):
    if torch._C._functorch.peek_interpreter_stack() is not None:  # inside torch.func.vmap / grad
        with temporarily_clear_interpreter_stack():  # the state is no captured tensor of the transformed function
            return accumulate_(physical(x), fstate, istate, scratch, enabled, params)
    _accumulate_checked(x, fstate, istate, enabled, *check_args(x, fstate, istate, scratch, enabled, params))


def physical(x):
    """x itself, or under torch.func transforms (a batched or gradient-tracking tensor has no data of its own) the
    tensor they wrap: under vmap the physical tensor that holds every sample's values, as the compiled op's vmap rule
    reads it (accumulate.py)."""
    while torch._C._functorch.is_functorch_wrapped_tensor(x):
        x = torch._C._functorch.get_unwrapped(x)
    return x


def _accumulate_checked(x, fstate, istate, enabled, lo, inv_w, eps, nbins, flags):
    if x.numel() == 0:
        return
    x = x.detach().reshape(-1)
    mode = enabled.reshape(()).long()
    on = mode != 0
    # the histograms (linear bins, log2 slots, float buckets) unless the flag has SKIP_HIST; NaN/Inf always
    hw = (on & ((mode & layout.SKIP_HIST) == 0)).long()
    xd = x.double()
    fin = torch.isfinite(xd)
    f = _bin_values(x)

    # moments of the finite values: float64, two passes, then Chan's merge into the state
    nb = fin.sum().double()
    safe = nb.clamp(min=1)
    # scaled by 2^-k, k = max(0, e - 500) for the largest magnitude 2^e: the sums of float64 squares of values
    # past ~1.3e154 stay finite; scaled back exactly (M2 is inf only where it passes float64's range itself)
    k = (torch.frexp(torch.where(fin, xd, 0).abs().amax()).exponent - 501).clamp(min=0).double()
    up = torch.pow(2.0, k)
    xs = torch.where(fin, xd * torch.pow(2.0, -k), 0)
    mean_s = xs.sum() / safe
    # corrected two-pass: the residual r of the rounded mean refines it and M2 (near DBL_MAX a constant tensor's
    # mean one ulp off would otherwise square to an M2 of inf)
    dev = torch.where(fin, xs - mean_s, 0)
    r = dev.sum()
    mean_b = (mean_s + r / safe) * up
    m2_b = (dev.square().sum() - r * r / safe).clamp(min=0) * up * up
    mn = torch.where(fin, xd, float("inf")).amin()
    mx = torch.where(fin, xd, float("-inf")).amax()
    # this call's own state (in the fstate's slot order) merged in, unless the call is off or saw no finite value
    merged = rawstate.combine(fstate, torch.stack([nb, mean_b, m2_b, mn, mx]))
    fstate.copy_(torch.where(~on | (nb == 0), fstate, merged))

    w = on.long()
    a = f if flags & layout.SIGNED_NEAR_ZERO else f.abs()
    istate[layout.COUNT] += w * x.numel()
    istate[layout.NEAR_ZERO] += w * (a <= torch.tensor(eps, dtype=torch.float32)).sum()

    # slots in the kernels' linear numbering (layout.lin_slots), kept in istate from kept_first on
    lin, first = istate[layout.LIN_BASE: layout.log_base(nbins, flags)], layout.kept_first(nbins, flags)
    nonfinite = torch.where(torch.isnan(f), nbins + 2, torch.where(f > 0, nbins + 3, nbins + 4))
    if flags & layout.LINEAR_HIST:
        t = (f - torch.tensor(lo, dtype=torch.float32)) * torch.tensor(inv_w, dtype=torch.float32)
        t = torch.where(t > -1, t, -1.0)
        t = torch.where(t < nbins, t, float(nbins))
        slots = torch.where(fin, t.floor().long() + 1, nonfinite)
        lin.index_add_(0, slots - first, torch.where(fin, hw, w))
    else:
        lin.index_add_(0, torch.where(fin, nbins + 2, nonfinite) - first, (~fin).long() * w)
    if flags & layout.LOG_HIST:
        lg = istate[layout.log_base(nbins, flags): layout.float_base(nbins, flags)]
        lg.index_add_(0, torch.where(fin, _log_slots(f), 0), fin.long() * hw)
    if flags & layout.FLOAT_HIST:
        fl = istate[layout.float_base(nbins, flags):]
        fl.index_add_(0, torch.where(fin, _float_slots(x), 0), fin.long() * hw)


def accumulate_many_(xs, fstates, istates, scratches, enabled, params):
    p = check_many_args(xs, fstates, istates, scratches, enabled, params)
    for x, f, i in zip(xs, fstates, istates):
        _accumulate_checked(x, f, i, enabled, *p)
