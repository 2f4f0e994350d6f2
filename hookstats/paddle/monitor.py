"""attach() for a paddle.nn.Layer: the torch Monitor's engine (state store, step clock, history, sinks, alerts,
reports) behind Paddle's hooks. PaddleMonitor changes only what touches the model: its hooks, watch() and the
rank the sinks write on."""

import inspect
import paddle

from ..adapter import Adapter
from ..clock import StepClock
from ..config import attach_config, check_arg
from ..hooks import Port
from ..monitor import HistSteps, Monitor
from ..sinks.muted import MutedSink
from ..state import StateStore, Kind, TargetKey
from ..user_warning import WarnOnce
from . import bridge
from .checks import check_model
from .hooks import LayerHooks
from .mode import TrainingMode
from .optimizer import OptimizerGrads
from .selection import select_layers

# attach() keywords that mean nothing for a Paddle model, and why: never silently ignored
UNSUPPORTED = {
    "input_grads": "Paddle has no backward hook on a Layer's inputs (PyTorch's full backward hooks); measure a "
                   "tensor's gradient with mon.watch(name, x) inside the forward instead",
}


class PaddleMonitor(Monitor):
    """A Monitor of a paddle.nn.Layer: stats(), history, sinks, alerts, reduce() and the context manager as for
    a torch model; the Paddle tensors reach the op through DLPack (hookstats/paddle/bridge.py)."""

    def __init__(self, layer, cfg, layers, every=1, eval=False, inputs=False, outputs=True, steps="forward",
                 grads=True, param_grads=False, separate_calls=False, optimizer=None):
        self.model, self.cfg, self.modules, self.track_eval = layer, cfg, layers, eval
        self.adapter = Adapter(layer)  # reduce() asks it
        self.store = StateStore(cfg)
        self.clock = StepClock(TrainingMode(layer), every, eval, steps, on_modes=self.store.set_modes,
                               exclusive=self.store.exclusive, hist_every=cfg.hist_every)
        self.every, self.separate_calls, self.tell = self.clock.every, separate_calls, WarnOnce()
        self.port = Port(self.store, self.clock, self.tell, separate_calls)
        self.step_listeners = self.clock.step_listeners
        self._hist_steps = HistSteps()
        self.step_listeners.append(self._hist_steps.on_step_end)
        self.forward_order = self.port.calls.forward_order
        self.clock.eager_listeners.append(self.port.settle)
        for p in layer.parameters():
            if (device := bridge.torch_device(p.place)) is not None:
                self.store.flags(device)
        grads_at_step = None
        if param_grads:
            named = [(f"{name}.{pn}", p) for name, m in layers.items()
                     for pn, p in m.named_parameters(include_sublayers=False)]
            grads_at_step = OptimizerGrads(self.port, named, optimizer)
        self.hooks = LayerHooks(self.port, layer, layers, self.clock.model, inputs=inputs, outputs=outputs,
                                grads=grads, param_grads=grads_at_step)
        self.taps = self.hooks.taps

    # Monitor.step() and stats() consult the torch parameter-gradient hooks; here the optimizer's step does it
    _param_grads = None
    _params = None

    def measure(self, key, t):
        """Feeds the Paddle tensor t to the state of `key` (a TargetKey) in the current phase."""
        self.taps.measure(key, t, self.clock.phase)

    def watch(self, name, tensor):
        """Call inside a forward: measures the Paddle tensor ("name:watch") and, unless it stops gradients,
        its gradient ("name:watch_grad"). Returns the tensor unchanged."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"watch: name must be a non-empty string, got {name!r}")
        if not bridge.is_floating(tensor):
            raise ValueError(f"watch({name!r}, ...): expected a float32/float64/float16/bfloat16 Paddle tensor, "
                             f"got {getattr(tensor, 'dtype', type(tensor).__name__)}")
        calls = self.port.calls
        phase = self.clock.hook_phase() if self.clock.attached else None
        if phase is None:
            return tensor
        calls.saw(name)
        call = calls.next_watch_call(name)
        if self.taps.readable(TargetKey(name, Kind.WATCH, "", call), tensor) is None:
            return tensor  # said once; its gradient, no more readable, is not tapped (as torch's watch)
        self.taps.measure(TargetKey(name, Kind.WATCH, "", call), tensor, phase)
        self.taps.tap_grad(TargetKey(name, Kind.WATCH_GRAD, "", call), tensor, phase)
        return tensor

    def reduce(self, group=None):
        """As Monitor.reduce() over torch.distributed ranks; Paddle's own process groups are not merged."""
        if paddle.distributed.get_world_size() > 1:
            from .. import distributed
            if not distributed.is_initialized():
                raise RuntimeError("reduce(): this is one of several Paddle ranks, and hookstats merges states "
                                   "over torch.distributed only: init a torch.distributed process group too "
                                   "(backend='gloo' or 'nccl'), or read each rank's mon.stats()")
        return super().reduce(group)


def attach(layer, *, modules=None, types=None, exclude=None, include_paramless=False, every=1, eval=None,
           steps="forward", inputs=False, outputs=True, grads=True, input_grads=False, param_grads=False,
           separate_calls=False, history=False, log_every=10, keep=1000, sinks=None, alerts=True,
           rank_zero_only=True, config=None, optimizer=None, **config_kwargs):
    """hookstats.attach() for a paddle.nn.Layer (hookstats.attach routes one here): the same keywords, on
    Paddle's named_sublayers() names. param_grads=True needs optimizer= (a paddle.optimizer.Optimizer whose
    step() is wrapped: each selected parameter's gradient is measured once per step, before the update).
    See docs/howto/paddle.md."""
    if not isinstance(layer, paddle.nn.Layer):
        raise ValueError(f"attach: model must be a torch.nn.Module or a paddle.nn.Layer, got "
                         f"{type(layer).__module__}.{type(layer).__name__}")
    from ..history import attach_history, history_options
    from ..sinks.base import check_sinks
    history = history_options(history, log_every, keep, sinks, alerts)
    eval = history is not None if eval is None else eval  # validation passes recorded wherever records go
    flags = dict(include_paramless=include_paramless, eval=eval, inputs=inputs, outputs=outputs, grads=grads,
                 input_grads=input_grads, param_grads=param_grads, separate_calls=separate_calls,
                 rank_zero_only=rank_zero_only)
    for name, v in flags.items():
        check_arg(name, v, bool)
    for name, why in UNSUPPORTED.items():
        if flags[name]:
            raise ValueError(f"attach: {name}=True has no meaning for a Paddle model: {why}")
    if optimizer is not None and not param_grads:
        raise ValueError("attach: optimizer= is used by param_grads=True only (its step() measures the parameter "
                         "gradients); pass param_grads=True or leave optimizer out")
    config = attach_config(config, config_kwargs, None if history is None else history["log_every"], every,
                           keywords=tuple(inspect.signature(attach).parameters))
    if history is not None and rank_zero_only and paddle.distributed.get_rank() != 0:
        history["sinks"] = [MutedSink(s) for s in check_sinks(history["sinks"])]
    layers = select_layers(layer, modules, types, exclude, include_paramless)
    check_model(layer, layers)
    mon = PaddleMonitor(layer, config, layers, every=every, eval=eval, inputs=inputs, outputs=outputs,
                        steps=steps, grads=grads, param_grads=param_grads, separate_calls=separate_calls,
                        optimizer=optimizer)
    mon.step_history = attach_history(mon, history)
    return mon
