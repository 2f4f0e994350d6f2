"""What attach() refuses in a Paddle model, up front and naming it: static-graph programs, which run no eager
hooks, and parameters on a device where the fused op has no kernel."""
import paddle
from paddle.jit.dy2static.program_translator import StaticFunction

from . import bridge


def check_model(layer, layers):
    """Raises a ValueError naming the first layer or parameter hookstats cannot measure."""
    if not paddle.in_dynamic_mode():
        raise ValueError("attach: Paddle is in static-graph mode (paddle.enable_static()); hookstats measures "
                         "eager (dygraph) models: call paddle.disable_static() first")
    for name, m in dict(layer.named_sublayers(include_self=True)).items():
        what = f"layer {name!r}" if name else f"the root layer ({type(layer).__name__})"
        if isinstance(m, paddle.jit.TranslatedLayer):
            raise ValueError(f"attach: {what} is a static-graph program loaded by paddle.jit.load: its forward runs "
                             "no Paddle hooks; attach to the eager model it was saved from")
        if isinstance(getattr(m, "forward", None), StaticFunction):
            raise ValueError(f"attach: {what} is a static-graph program (paddle.jit.to_static): hooks inside it "
                             "never see eager tensors; attach to the eager model, or before to_static is applied "
                             "to the root layer only")
    for name, m in layers.items():
        for pn, p in m.named_parameters(include_sublayers=False):
            if bridge.torch_device(p.place) is None:
                raise ValueError(f"attach: parameter {name}.{pn} is {bridge.no_kernel(p.place)}; move the model "
                                 "to a supported device or leave this layer out (exclude=)")
