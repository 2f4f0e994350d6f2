"""This process's place in torch.distributed: what the file sinks (which file a rank writes) and reduce() (which
ranks merge) both ask, in a module that imports neither of them."""
import torch.distributed as dist


def is_initialized():
    return dist.is_available() and dist.is_initialized()


def rank(group=None):
    """This process's rank in `group` (0 without torch.distributed): sinks write where this is 0."""
    return dist.get_rank(group) if is_initialized() else 0


def world_size(group=None):
    return dist.get_world_size(group) if is_initialized() else 1
