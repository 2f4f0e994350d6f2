"""Counting host syncs: the ops that block the host on a GPU, seen through a TorchDispatchMode."""
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .models import make_workload
from .timing import device
from .variants import VARIANTS


class SyncCounter(TorchDispatchMode):
    """Counts what blocks the host on a GPU: .item() (aten._local_scalar_dense), data-dependent shapes
    (nonzero, masked_select: boolean indexing) and blocking device-to-host copies."""

    SYNC_OPS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select")

    def __init__(self):
        super().__init__()
        self.counts = {}

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func._schema.name
        if name in self.SYNC_OPS:
            self.counts[name] = self.counts.get(name, 0) + 1
        elif name in ("aten::_to_copy", "aten::copy_") and self._device_to_host(func, args, kwargs, out):
            self.counts["device-to-host copy"] = self.counts.get("device-to-host copy", 0) + 1
        return out

    @staticmethod
    def _device_to_host(func, args, kwargs, out):
        """A device-to-host copy that blocks the host: a non_blocking copy into pinned memory does not."""
        is_copy = func._schema.name == "aten::copy_"
        src = args[1] if is_copy else args[0]
        dst = args[0] if is_copy else out
        if not (isinstance(src, torch.Tensor) and isinstance(dst, torch.Tensor)
                and src.device.type != "cpu" and dst.device.type == "cpu"):
            return False
        non_blocking = (kwargs or {}).get("non_blocking", args[2] if is_copy and len(args) > 2 else False)
        return not (non_blocking and dst.is_pinned())

    @property
    def total(self):
        return sum(self.counts.values())


def count_syncs(workload, variant, steps=3):
    """(syncs per step, {op: per step}) of a variant, after one step outside the count."""
    model, step = make_workload(workload, device=device())
    inst = VARIANTS[variant](model)
    try:
        step()
        inst.after_step()
        with SyncCounter() as c:
            for _ in range(steps):
                step()
                inst.after_step()
    finally:
        inst.remove()
    return c.total / steps, {k: v / steps for k, v in c.counts.items()}
