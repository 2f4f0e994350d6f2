"""A target's device buffers (TargetState: fstate, istate, the CUDA kernel's scratch; allocated once, updated in
place by the fused op, at fixed addresses) and the stream order before torch ops touch them."""
import torch

from . import accumulate, rawstate


class TargetState:
    """The running state of one target in one phase on one device. Allocated once, updated in place."""

    __slots__ = ("key", "phase", "fstate", "istate", "scratch", "reached", "closed_f")

    def __init__(self, key, phase, device, cfg):
        self.key, self.phase = key, phase
        self.reached = False  # preallocated states no hook ever reached are left out of stats()
        self.fstate, self.istate = rawstate.empty(cfg.istate_size, device=device)
        self.scratch = torch.zeros(scratch_bytes(device), dtype=torch.uint8, device=device)
        for t in (self.fstate, self.istate, self.scratch):
            mark_static(t)
        # With a per-step history, the op's fstate holds the open step only and closed_f the steps before
        # it (merged in at each step end), so a step's moments never come from subtracting running totals.
        self.closed_f = None

    def split_steps(self):
        if self.closed_f is None:
            self.closed_f = self.fstate.clone()
            self.fstate.copy_(rawstate.empty(device=self.fstate.device))

    def total_fstate(self):
        """The running fstate since attach or reset(), on the device."""
        return self.fstate if self.closed_f is None else rawstate.combine(self.closed_f, self.fstate)

    def load(self, total_f, istate):
        """Makes the running totals those of a checkpoint (checkpoint.py), with no open step."""
        order([self])
        if self.closed_f is None:
            self.fstate.copy_(total_f)
        else:
            self.closed_f.copy_(total_f)
            self.fstate.copy_(rawstate.empty(device=self.fstate.device))
        self.istate.copy_(istate)
        self.reached = True

    def reset(self):
        self.fstate.copy_(rawstate.empty(device=self.fstate.device))
        if self.closed_f is not None:
            self.closed_f.copy_(self.fstate)
        self.istate.zero_()

    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in (self.fstate, self.istate, self.scratch, self.closed_f)
                   if t is not None)


def order(states):
    """Before torch ops read or write these TargetStates on the current stream: they wait for the op's launches on
    them from other streams (accumulate.order_states)."""
    accumulate.order_states([st.fstate for st in states])


def scratch_bytes(device):
    """Per-state scratch of the CUDA kernel (ticket + one partial per block of its grid), as the kernel
    computes it (csrc/cuda/accumulate_cuda.cpp); the CPU kernel and the reference path need none."""
    device = torch.device(device)
    if device.type != "cuda" or not accumulate.has_cuda_kernel():
        return 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.ops.hookstats.cuda_scratch_bytes(index)


def mark_static(t):
    """Fixed addresses let CUDA graphs (torch.compile mode="reduce-overhead") keep the state in place."""
    try:
        torch._dynamo.mark_static_address(t)
    except Exception:  # older torch: nothing to mark
        pass
