"""Which tensors the op reads (measured(): the dtypes, layouts and subclasses hookstats can read) and where
tensors sit inside a module's outputs and inputs (tensor_leaves)."""
import dataclasses

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.nn.parameter import is_lazy

MEASURED_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def measured(t):
    """The plain strided tensor the op reads for t, or None when t is not measured: integer, bool, complex,
    quantized and float8 tensors, meta and sparse tensors, lazy parameters, and tensor subclasses whose
    data hookstats cannot read (a __torch_dispatch__ wrapper). A nested tensor is read through its packed
    values (TransformerEncoder's eval fast path), a DTensor through this rank's shard (mon.reduce() merges
    the ranks; a Partial one is not measured: its local values are addends of the value, not values), an
    AsyncCollectiveTensor (a tensor-parallel output) once its collective is done. Never an error: a monitor
    must not stop the forward."""
    kind = type(t)
    if (kind is torch.Tensor or kind is torch.nn.Parameter) and t.dtype in MEASURED_DTYPES \
            and t.layout == torch.strided and t.device.type != "meta" and not t.is_nested:
        return t  # the common case first: the hooks run this for every tensor
    if not isinstance(t, torch.Tensor) or t.dtype not in MEASURED_DTYPES:
        return None
    if torch.compiler.is_compiling():  # traced tensors are plain; the checks below would not trace
        return t if t.layout == torch.strided and t.device.type != "meta" else None
    if t.is_nested:
        return t.values() if t.layout == torch.jagged or t.is_contiguous() else t.contiguous().values()
    if t.layout != torch.strided or t.device.type == "meta" or kind is torch.Tensor or kind is torch.nn.Parameter:
        return None
    if is_lazy(t):
        return None
    if hasattr(t, "to_local"):  # DTensor
        return None if is_partial(t) else measured(t.to_local())
    if hasattr(t, "trigger_wait"):  # AsyncCollectiveTensor
        # the wait its first consumer would make anyway (torch's own rule for these tensors), made a moment
        # earlier and only once: on CUDA a wait of the stream on the collective, not a host sync
        return measured(t.trigger_wait())
    if isinstance(t, FakeTensor):  # stands for a real tensor: the op's fake kernel takes it (hookstats.plan)
        return t
    return t if kind.__torch_dispatch__ is torch.Tensor.__torch_dispatch__ else None


def is_partial(dtensor):
    return any(p.is_partial() for p in dtensor.placements)


def placement_of(t):
    """How a DTensor lies over its mesh, by named dimension: ((name, "shard" | "replicate"), ...), or None for
    a tensor that does not say (a plain tensor, a mesh without names). Attribute reads only: no collective."""
    mesh, placements = getattr(t, "device_mesh", None), getattr(t, "placements", None)
    names = getattr(mesh, "mesh_dim_names", None)
    if placements is None or not names:
        return None
    return tuple((n, "shard" if p.is_shard() else "replicate" if p.is_replicate() else "partial")
                 for n, p in zip(names, placements))


def is_measurable(t):
    return measured(t) is not None


def unread_reason(t):
    """Why a floating tensor holding data is not measured (said once per target), or None when it is measured or
    is not meant to be (integer, bool, complex and meta tensors)."""
    if not isinstance(t, torch.Tensor) or t.dtype not in MEASURED_DTYPES or t.device.type == "meta" \
            or torch.compiler.is_compiling() or measured(t) is not None:
        return None
    if t.layout != torch.strided:
        return f"a {t.layout} tensor"
    if hasattr(t, "to_local") and is_partial(t):
        return ("a DTensor with a Partial placement, whose local values are addends of the value, not values "
                "(attach after parallelize_module, so that the module's output is measured after its reduction)")
    return f"a {type(t).__name__}, a tensor subclass whose data hookstats cannot read"


def watch_unread_reason(t):
    """Why a floating tensor given to watch() is not measured, or None when it is: unread_reason's, and a meta
    tensor too (watch names the tensor itself, so its having no values is worth saying)."""
    if isinstance(t, torch.Tensor) and t.dtype in MEASURED_DTYPES and t.device.type == "meta" \
            and not torch.compiler.is_compiling():
        return "a meta tensor, which holds no values"
    return unread_reason(t)


def tensor_leaves(obj, path="", kind=torch.Tensor):
    """(path, tensor) for every tensor inside tuples, lists, dicts and dataclasses (HF ModelOutput too); kind: the
    tensor class (paddle.Tensor for a Paddle model's outputs)."""
    if isinstance(obj, kind):
        yield path, obj
    elif isinstance(obj, dict):  # ModelOutput is an OrderedDict
        for k, v in obj.items():
            yield from tensor_leaves(v, f"{path}[{k!r}]", kind)
    elif isinstance(obj, (tuple, list)):
        for k, v in enumerate(obj):
            yield from tensor_leaves(v, f"{path}[{k}]", kind)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for fld in dataclasses.fields(obj):
            yield from tensor_leaves(getattr(obj, fld.name), f"{path}.{fld.name}", kind)
