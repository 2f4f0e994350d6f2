"""Pure-PyTorch accumulate_: the fallback when the extension is missing, and the oracle of the tests.

Same signature and state layout as the C++/CUDA op (csrc/accumulator.h). Moments are float64 two-pass
over the tensor; bins use the kernels' float32 formula. Runs on any device with no host sync: no
.item(), no bincount, no range-inferring histc; `enabled` masks the update on the device.
"""
import torch

from . import layout

_FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
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


def _check(x, fstate, istate, enabled, nbins, flags):
    if x.dtype not in _FLOAT_DTYPES:
        raise RuntimeError(f"hookstats.accumulate_: x must be float32, float64, float16 or bfloat16, got {x.dtype}")
    if not 1 <= nbins <= layout.MAX_BINS:
        raise RuntimeError(f"hookstats.accumulate_: nbins must be in [1, {layout.MAX_BINS}], got {nbins}")
    if fstate.dtype != torch.float64 or fstate.numel() != layout.FSTATE_SIZE:
        raise RuntimeError("hookstats.accumulate_: fstate must be a float64 tensor of 5 elements")
    if istate.dtype != torch.int64 or istate.numel() != layout.istate_size(nbins):
        raise RuntimeError(f"hookstats.accumulate_: istate must be an int64 tensor of {layout.istate_size(nbins)} "
                           f"elements for nbins={nbins}, got {istate.numel()}")
    if enabled.numel() != 1:
        raise RuntimeError("hookstats.accumulate_: enabled must have one element")


def accumulate_(x, fstate, istate, scratch, enabled, lo, inv_w, eps, nbins, flags):
    _check(x, fstate, istate, enabled, nbins, flags)
    if x.numel() == 0:
        return
    x = x.detach().reshape(-1)
    on = enabled.reshape(()).to(torch.bool)
    xd = x.double()
    fin = torch.isfinite(xd)
    f = _bin_values(x)

    # moments of the finite values: float64, two passes, then Chan's merge into the state
    nb = fin.sum().double()
    safe = nb.clamp(min=1)
    mean_b = torch.where(fin, xd, 0).sum() / safe
    m2_b = torch.where(fin, xd - mean_b, 0).square().sum()
    na, ma, m2a = fstate[layout.N_FINITE], fstate[layout.MEAN], fstate[layout.M2]
    n = na + nb
    d = mean_b - ma
    frac = nb / n.clamp(min=1)
    new = torch.stack([n, ma + d * frac, m2a + m2_b + d * d * na * frac])
    keep = ~on | (nb == 0)
    fstate[: layout.MIN].copy_(torch.where(keep, fstate[: layout.MIN], new))
    mn = torch.where(fin, xd, float("inf")).amin()
    mx = torch.where(fin, xd, float("-inf")).amax()
    empty = torch.tensor(float("nan"), dtype=torch.float64, device=x.device)
    mn = torch.where(keep, empty, mn)
    mx = torch.where(keep, empty, mx)
    fstate[layout.MIN].copy_(torch.fmin(fstate[layout.MIN], mn))
    fstate[layout.MAX].copy_(torch.fmax(fstate[layout.MAX], mx))

    w = on.long()
    a = f if flags & layout.SIGNED_NEAR_ZERO else f.abs()
    istate[layout.COUNT] += w * x.numel()
    istate[layout.NEAR_ZERO] += w * (a <= torch.tensor(eps, dtype=torch.float32)).sum()

    lin = istate[layout.LIN_BASE: layout.LIN_BASE + layout.lin_slots(nbins)]
    nonfinite = torch.where(torch.isnan(f), nbins + 2, torch.where(f > 0, nbins + 3, nbins + 4))
    if flags & layout.LINEAR_HIST:
        t = (f - torch.tensor(lo, dtype=torch.float32)) * torch.tensor(inv_w, dtype=torch.float32)
        t = torch.where(t > -1, t, -1.0)
        t = torch.where(t < nbins, t, float(nbins))
        slots = torch.where(fin, t.floor().long() + 1, nonfinite)
        lin.index_add_(0, slots, w.expand(slots.shape))
    else:
        lin.index_add_(0, torch.where(fin, nbins + 2, nonfinite), (~fin).long() * w)
    if flags & layout.LOG_HIST:
        lg = istate[layout.log_base(nbins):]
        lg.index_add_(0, torch.where(fin, _log_slots(f), 0), fin.long() * w)


def accumulate_many_(xs, fstates, istates, scratches, enabled, lo, inv_w, eps, nbins, flags):
    if not len(xs) == len(fstates) == len(istates) == len(scratches):
        raise RuntimeError("hookstats.accumulate_many_: xs, fstates, istates and scratches must have equal lengths")
    for x, f, i, s in zip(xs, fstates, istates, scratches):
        accumulate_(x, f, i, s, enabled, lo, inv_w, eps, nbins, flags)
