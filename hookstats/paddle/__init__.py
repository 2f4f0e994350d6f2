"""hookstats for PaddlePaddle: hookstats.attach(layer) on a paddle.nn.Layer measures it with the same fused op,
state and reports as a torch model, through Paddle's forward pre/post hooks and Tensor.register_hook, each
Paddle tensor read in place through DLPack. Imported only when a Paddle object is attached."""
from .monitor import PaddleMonitor, attach

__all__ = ["attach", "PaddleMonitor"]
