"""hookstats for PaddlePaddle: hookstats.attach(layer) on a paddle.nn.Layer measures it with the same Monitor, hooks,
fused op, state and reports as a torch model; what differs is the adapter (adapter.py), each Paddle tensor read in
place through DLPack (bridge.py). Imported only when a Paddle object is attached."""
from ..facade import Monitor as PaddleMonitor  # a Paddle model's monitor is a Monitor: the name stays importable

__all__ = ["attach", "PaddleMonitor"]


def attach(layer, **kwargs):
    """hookstats.attach() for a paddle.nn.Layer only (the same keywords; see docs/howto/paddle.md)."""
    from .. import attach as attach_model  # the package's own: this folder is what it picks for a Paddle model
    from .adapter import PaddleAdapter
    if not PaddleAdapter.is_model(layer):
        raise ValueError(f"attach: model must be a torch.nn.Module or a paddle.nn.Layer, got "
                         f"{type(layer).__module__}.{type(layer).__name__}")
    return attach_model(layer, **kwargs)
