"""The Paddle adapter: hookstats.attach(layer) on a paddle.nn.Layer runs the same Monitor, hooks and engine as a
torch model, through Paddle's forward pre/post hooks and Tensor.register_hook; each Paddle tensor reaches the fused
op through the bridge (bridge.py: DLPack, no copy, ordered with Paddle's stream); parameter gradients at the step of
the optimizer given to attach (optimizer.py)."""
import functools

import paddle
from paddle.jit.dy2static.program_translator import StaticFunction

from ..adapter import Adapter
from ..hooks.grad_taps import tell_split_step
from ..selection import select
from ..sinks.base import check_sinks
from ..sinks.muted import MutedSink
from ..phases import Phase
from ..targets import Kind, TargetKey
from . import bridge
from .optimizer import OptimizerGrads

# attach() keywords that mean nothing for a Paddle model, and why: never silently ignored
UNSUPPORTED = {
    "input_grads": "Paddle has no backward hook on a Layer's inputs (PyTorch's full backward hooks); measure a "
                   "tensor's gradient with mon.watch(name, x) inside the forward instead",
}


class PaddleAdapter(Adapter):
    noun = "paddle.nn.Layer"
    refused = {"params": "is not supported for a paddle.nn.Layer yet",
               "start_step": "is not supported for a paddle.nn.Layer yet"}
    foreign = ("clip_norm",)

    def __init__(self, layer):
        super().__init__(layer)
        self.order = bridge.StreamOrder()
        self.gradless = set()  # layers run without grad in the running root forward (recompute's first pass)

    @staticmethod
    def is_model(obj):
        return isinstance(obj, paddle.nn.Layer)

    def bind(self, port):
        super().bind(port)
        port.clock.forward_listeners.append(self.gradless.clear)  # recompute's first pass is per root forward

    # ---- the model ----
    def select(self, options):
        """The rules of hookstats.selection on Paddle's named_sublayers() names."""
        return select(layer_names(self.model), options.modules, options.types, options.exclude,
                      options.include_paramless, own_params, paddle.nn.Layer, "paddle.nn.Layer", "layer")

    def check_options(self, options):
        for name, why in UNSUPPORTED.items():
            if options[name]:
                raise ValueError(f"attach: {name}=True has no meaning for a Paddle model: {why}")
        if options["optimizer"] is not None and not options["param_grads"]:
            raise ValueError("attach: optimizer= is used by param_grads=True only (its step() measures the parameter "
                             "gradients); pass param_grads=True or leave optimizer out")

    def check_model(self, selected):
        """Refuses static-graph programs, which run no eager hooks, and parameters on a device where the fused op
        has no kernel, naming the first."""
        layer = self.model
        if not paddle.in_dynamic_mode():
            raise ValueError("attach: Paddle is in static-graph mode (paddle.enable_static()); hookstats measures "
                             "eager (dygraph) models: call paddle.disable_static() first")
        for name, m in dict(layer.named_sublayers(include_self=True)).items():
            what = f"layer {name!r}" if name else f"the root layer ({type(layer).__name__})"
            if isinstance(m, paddle.jit.TranslatedLayer):
                raise ValueError(f"attach: {what} is a static-graph program loaded by paddle.jit.load: its forward "
                                 "runs no Paddle hooks; attach to the eager model it was saved from")
            if isinstance(getattr(m, "forward", None), StaticFunction):
                raise ValueError(f"attach: {what} is a static-graph program (paddle.jit.to_static): hooks inside it "
                                 "never see eager tensors; attach to the eager model, or before to_static is "
                                 "applied to the root layer only")
        for name, m in selected.items():
            for pn, p in m.named_parameters(include_sublayers=False):
                if bridge.torch_device(p.place) is None:
                    raise ValueError(f"attach: parameter {name}.{pn} is {bridge.no_kernel(p.place)}; move the "
                                     "model to a supported device or leave this layer out (exclude=)")

    def mode(self):
        return TrainingMode(self.model)

    def flag_devices(self):
        return [d for p in self.model.parameters() if (d := bridge.torch_device(p.place)) is not None]

    def own_params(self, module):
        return module.named_parameters(include_sublayers=False)

    def trainable(self, param):
        return not param.stop_gradient

    def submodules(self):
        return self.model.sublayers(include_self=True)

    def passive(self, module):
        """A layer added after attach with one sublayer and no parameters of its own only wraps that sublayer."""
        return len(list(module.children())) == 1 and not own_params(module)

    def state_device(self, module):
        p = next((p for p in module.parameters(include_sublayers=False) if p.dtype in bridge.MEASURED_DTYPES), None)
        return bridge.torch_device(p.place) if p is not None else None

    # ---- hooks ----
    def root_hooks(self, clock):
        mode = clock.model
        return (lambda _, args: clock.on_root_forward(mode, args)), clock.on_root_forward_end

    def parameter_hooks(self, named, options):
        """Paddle has no global optimizer hook: the optimizer given to attach() has its step() wrapped."""
        return (OptimizerGrads(self.port, named, options.optimizer) if options.param_grads else None), None

    def recompute_test(self, name):
        return functools.partial(self.recomputing, name)

    def recomputing(self, name):
        """Whether this call of layer `name` is Paddle's recompute (activation checkpointing) running the layer
        again in backward: its first pass ran inside the root forward without grad, and now it runs outside any
        root forward with grad. Its values were measured in the first pass; its gradients flow through this one."""
        grad, clock = paddle.is_grad_enabled(), self.port.clock
        if clock.root_running > 0:
            if not grad and clock.phase == Phase.TRAIN:
                self.gradless.add(name)
            return False
        return grad and name in self.gradless

    def leaves(self, obj, path=""):
        return bridge.paddle_leaves(obj, path)

    def output_reader(self, name, values, grads):
        def read(out, call, phase, compiling, recompute):
            for leaf, t in self.leaves(out):
                if values and not recompute:
                    self.measure(TargetKey(name, Kind.OUTPUT, leaf, call), t, phase)
                if grads:
                    self.tap_grad(TargetKey(name, Kind.GRAD_OUTPUT, leaf, call), t, phase)
        return read

    def readable(self, key, t):
        """The torch device of t when it is measured, else None (said once per target for a floating tensor
        the op cannot read)."""
        if not bridge.is_floating(t):
            return None
        device = bridge.torch_device(t.place)
        if device is None or t.is_sparse() or not paddle.in_dynamic_mode():
            why = bridge.unread_reason(t)
            self.port.tell(f"unread:{key.id}", f"hookstats: {key.id} is not measured: its tensor is {why}")
            return None
        return device

    def measure(self, key, t, phase, compiling=None, table=None):
        """Converts t (bridge.as_torch, no copy) and hands it to the accumulate path the torch hooks use."""
        device = self.readable(key, t)
        if device is not None:
            port = self.port
            self.order.run(t.place, device, lambda: port.measure_in(key, bridge.as_torch(t), phase, compiling=False))

    def tap_grad(self, key, t, phase):
        """Measures the gradient of the loss w.r.t. t when it arrives in backward (Tensor.register_hook)."""
        if t.stop_gradient:
            return
        device = self.readable(key, t)
        if device is None:
            return
        store, clock, order, tell = self.port.store, self.port.clock, self.order, self.port.tell
        st, flag = store.resolve(key, device, phase, reach=False, compiling=False)
        step = clock.step_count

        def on_grad(g):
            if clock.attached:
                if clock.step_count != step:
                    tell_split_step(tell, key, step, clock.step_count)
                st.reached = st.reached or clock.measures(phase)  # paused since the forward: the flag masks the op
                order.run(g.place, device, lambda: store.accumulate(bridge.as_torch(g), st, flag))
            return None

        t.register_hook(on_grad)

    def watch(self, name, t):
        """Measures the Paddle tensor ("name:watch") and, unless it stops gradients, its gradient
        ("name:watch_grad"). Returns the tensor unchanged."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"watch: name must be a non-empty string, got {name!r}")
        if not bridge.is_floating(t):
            raise ValueError(f"watch({name!r}, ...): expected a float32/float64/float16/bfloat16 Paddle tensor, "
                             f"got {getattr(t, 'dtype', type(t).__name__)}")
        clock, calls = self.port.clock, self.port.calls
        phase = clock.hook_phase() if clock.attached else None
        if phase is None:
            return t
        calls.saw(name)
        call = calls.next_watch_call(name)
        if self.readable(TargetKey(name, Kind.WATCH, "", call), t) is None:
            return t  # said once; its gradient, no more readable, is not tapped (as torch's watch)
        self.measure(TargetKey(name, Kind.WATCH, "", call), t, phase)
        self.tap_grad(TargetKey(name, Kind.WATCH_GRAD, "", call), t, phase)
        return t

    # ---- around the monitor ----
    def rank_zero_sinks(self, sinks):
        return [MutedSink(s) for s in check_sinks(sinks)] if paddle.distributed.get_rank() != 0 else sinks

    def check_reduce(self):
        """reduce() merges over torch.distributed ranks; Paddle's own process groups are not merged."""
        if paddle.distributed.get_world_size() > 1:
            from .. import distributed
            if not distributed.is_initialized():
                raise RuntimeError("reduce(): this is one of several Paddle ranks, and hookstats merges states "
                                   "over torch.distributed only: init a torch.distributed process group too "
                                   "(backend='gloo' or 'nccl'), or read each rank's mon.stats()")


class TrainingMode:
    """What the step clock reads as the root layer's mode: a root forward is a train forward when the layer is in
    training mode (layer.train()) and gradients are enabled: evaluation under paddle.no_grad() is eval, as under
    layer.eval(), and follows eval=."""

    def __init__(self, layer):
        self.layer = layer

    @property
    def training(self):
        return self.layer.training and paddle.is_grad_enabled()


def own_params(layer):
    return next(iter(layer.parameters(include_sublayers=False)), None) is not None


def layer_names(layer):
    """name -> layer as targets name them: named_sublayers(include_self=True), the root (named "" there) named
    after its class ("MLP:output"; "MLP_root" if a sublayer has that name)."""
    named = dict(layer.named_sublayers(include_self=True))
    root = type(layer).__name__
    root = root if root not in named else f"{root}_root"
    return {(n or root): m for n, m in named.items()}
