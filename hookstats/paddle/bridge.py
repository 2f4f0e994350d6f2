"""The tensor bridge: a Paddle tensor reaches the fused op as a torch tensor sharing its memory (DLPack, no
copy), on the device where the op has a kernel, ordered with Paddle's current CUDA stream on a GPU."""
import functools

import paddle
import torch
from paddle.utils.dlpack import to_dlpack
from torch.utils.dlpack import from_dlpack

from .. import accumulate
from ..tensors import tensor_leaves

MEASURED_DTYPES = (paddle.float32, paddle.float64, paddle.float16, paddle.bfloat16)
CPU = torch.device("cpu")


@functools.cache  # asked per tensor: the dispatcher lookup costs microseconds
def kernel_devices():
    """Paddle device kinds the fused op has a kernel for: the CPU always, the GPU when it was built with CUDA."""
    return ("cpu", "gpu") if accumulate.has_cuda_kernel() else ("cpu",)


def torch_device(place):
    """The torch device of a Paddle place, or None when the op has no kernel there (XPU, custom devices,
    pinned host memory, a GPU without the op's CUDA kernel)."""
    kinds = kernel_devices()
    if place.is_cpu_place() and "cpu" in kinds:
        return CPU
    if place.is_gpu_place() and "gpu" in kinds:
        return torch.device("cuda", place.gpu_device_id())
    return None


def no_kernel(place):
    return f"on {place}, where the fused op has no kernel (it has kernels for {', '.join(kernel_devices())})"


def is_floating(t):
    return isinstance(t, paddle.Tensor) and t.dtype in MEASURED_DTYPES


def unread_reason(t):
    """Why a floating Paddle tensor is not measured (said once per target), or None when it is."""
    if not paddle.in_dynamic_mode():
        return "a static-graph value (paddle.jit.to_static traces it): only eager (dygraph) tensors are measured"
    if t.is_sparse():
        return "a sparse tensor"
    if t.is_selected_rows():  # nn.Embedding(sparse=True)'s gradient
        return "a SelectedRows tensor (sparse rows)"
    if torch_device(t.place) is None:
        return no_kernel(t.place)
    return None


def as_torch(t):
    """The torch tensor sharing t's memory (same data pointer, dtype, shape and strides). detach(): Paddle
    exports no tensor that requires gradients; the detached tensor shares the memory. Through a capsule, not
    torch.from_dlpack(t): that asks for __dlpack__(stream=torch's stream), twice the cost, and the op runs on
    Paddle's own stream anyway (StreamOrder)."""
    return from_dlpack(to_dlpack(t.detach()))


class StreamOrder:
    """On a GPU the op runs on Paddle's current stream, so it is ordered after the kernels that wrote the tensor
    and before any later reuse of its memory, with no host sync. The state is torch's: the op first waits for
    torch's current stream (flag updates, reset), and torch's stream then waits for the op (stats(), flushes).
    Both waits are device-side events."""

    def __init__(self):
        self.streams = {}  # (device index, Paddle stream pointer) -> torch.cuda.ExternalStream

    def run(self, place, device, fn):
        """fn() (which converts the tensors on `place` and feeds the op) ordered with Paddle's current stream."""
        if device.type == "cpu":
            return fn()
        ptr = paddle.device.current_stream(place).stream_base.cuda_stream
        ext = self.streams.get((device.index, ptr))
        if ext is None:
            ext = self.streams[(device.index, ptr)] = torch.cuda.ExternalStream(ptr, device=device)
        own = torch.cuda.current_stream(device)
        if own.cuda_stream == ext.cuda_stream:
            return fn()
        ext.wait_stream(own)
        with torch.cuda.stream(ext):
            out = fn()
        own.wait_stream(ext)
        return out


def paddle_leaves(obj, path=""):
    """(path, tensor) for every Paddle tensor inside tuples, lists, dicts and dataclasses, named as torch's."""
    return tensor_leaves(obj, path, kind=paddle.Tensor)
