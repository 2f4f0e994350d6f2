"""Which framework adapter a model gets: torch for an nn.Module, Paddle for a paddle.nn.Layer (Paddle is imported only
for a Paddle model). A new framework is one Adapter subclass (adapter.py) and its lines here."""


def adapter_for(model):
    """The Adapter of the model's framework: torch for an nn.Module, Paddle for a paddle.nn.Layer (Paddle is
    imported only then). Anything else is a ValueError."""
    from .torch_adapter import TorchAdapter
    if TorchAdapter.is_model(model):
        return TorchAdapter(model)
    if from_paddle(model):
        from .paddle.adapter import PaddleAdapter
        if PaddleAdapter.is_model(model):
            return PaddleAdapter(model)
        raise ValueError(f"attach: model must be a torch.nn.Module or a paddle.nn.Layer, got "
                         f"{type(model).__module__}.{type(model).__name__}")
    raise ValueError(f"attach: model must be an nn.Module (or a paddle.nn.Layer), got "
                     f"{type(model).__module__}.{type(model).__name__}")


def from_paddle(obj):
    """Whether obj's class, or a class it derives from, is PaddlePaddle's (read without importing paddle)."""
    return any(c.__module__.split(".")[0] == "paddle" for c in type(obj).__mro__)
