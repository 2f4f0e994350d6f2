"""hookstats.attach: a torch nn.Module goes to monitor.attach, a paddle.nn.Layer to hookstats.paddle (Paddle is
imported only for a Paddle model), so the torch engine never imports the Paddle front end that builds on it."""
import functools

from torch import nn

from . import monitor


def from_paddle(obj):
    """Whether obj's class, or a class it derives from, is PaddlePaddle's (read without importing paddle)."""
    return any(c.__module__.split(".")[0] == "paddle" for c in type(obj).__mro__)


@functools.wraps(monitor.attach)
def attach(model, **kwargs):
    if not isinstance(model, nn.Module) and from_paddle(model):
        from .paddle import attach as attach_paddle
        for name in ("params", "start_step"):
            if kwargs.get(name):
                raise ValueError(f"attach: {name}= is not supported for a paddle.nn.Layer yet")
            kwargs.pop(name, None)
        return attach_paddle(model, **kwargs)
    return monitor.attach(model, **kwargs)
