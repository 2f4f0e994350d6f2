"""This process's place in torch.distributed: what the file sinks (which file a rank writes) and reduce() (which
ranks merge) both ask, in a module that imports neither of them. A process that has not imported torch has no
process group, so reading a saved run (`hookstats report`) asks without importing it."""
import sys


def _dist():
    """torch.distributed where a process group may exist, else None."""
    if "torch" not in sys.modules:
        return None
    import torch.distributed as dist
    return dist


def is_initialized():
    dist = _dist()
    return dist is not None and dist.is_available() and dist.is_initialized()


def rank(group=None):
    """This process's rank in `group` (0 without torch.distributed): sinks write where this is 0."""
    return _dist().get_rank(group) if is_initialized() else 0


def world_size(group=None):
    return _dist().get_world_size(group) if is_initialized() else 1
