"""The torch adapter: nn.Module hooks, torch.optim's global step hooks, autograd-node gradient taps, and the
eager fast path that keeps each output's bound op arguments between calls."""
import torch
from torch import nn
from torch.nn.utils import parametrize

from .adapter import Adapter
from .clock import in_recompute
from .hooks.grad_taps import GradTap, tap_grad
from .hooks.handles import optimizer_hooks
from .hooks.input_grads import InputGrads
from .hooks.param_grads import ParamGrads
from .hooks.params import ParamValues
from .hooks.watch import watch
from .selection import select_modules
from .sinks.muted import rank_zero_sinks
from .targets import Kind, TargetKey
from .tensors import is_measurable, tensor_leaves


class TorchAdapter(Adapter):
    noun = "nn.Module"
    foreign = ("optimizer",)
    rank_zero_sinks = staticmethod(rank_zero_sinks)

    @staticmethod
    def is_model(obj):
        return isinstance(obj, nn.Module)

    def select(self, options):
        return select_modules(self.model, options.modules, options.types, options.exclude, options.include_paramless)

    def flag_devices(self):
        model = self.model
        devices = {t.device for t in (*model.parameters(), *model.buffers())} - {torch.device("meta")}
        return [*devices, torch.device("cpu")]

    def own_params(self, module):
        return module.named_parameters(recurse=False)

    def trainable(self, param):
        return param.requires_grad

    def submodules(self):
        return self.model.modules()

    def passive(self, module):
        if isinstance(module, parametrize.ParametrizationList):  # its parameters are its module's: measured_params
            return True
        children = list(module.children())
        return len(children) == 1 and next(module.parameters(recurse=False), None) is None

    def measured_params(self, module):
        yield from module.named_parameters(recurse=False)
        if parametrize.is_parametrized(module):  # weight_norm & co. moved the parameter there
            yield from (("parametrizations." + n, p) for n, p in module.parametrizations.named_parameters())

    def state_device(self, module):
        p = next(module.parameters(recurse=False), None)
        return p.device if is_measurable(p) else None

    def parameter_hooks(self, named, options):
        return (ParamGrads(self.port, named) if options.param_grads else None,
                ParamValues(self.port, named) if options.params else None)

    def step_hooks(self, clock):
        return optimizer_hooks(clock.on_optimizer_pre_step, clock.on_optimizer_step)

    def input_grads(self, name, module):
        return InputGrads(self.port, name, module)

    def recompute_test(self, name):
        # a recomputed forward (checkpointing) was measured the first time; with use_reentrant=True its gradients
        # flow through the recomputed graph only, so they are tapped there
        return in_recompute

    leaves = staticmethod(tensor_leaves)

    def output_reader(self, name, values, grads):
        """Everything a call can share with the next is resolved once and kept per (leaf, call, phase): the op's
        bound arguments of the output's state (eager code passes them to StateStore.update, which checks x's
        device and kind itself) and the GradTap of its gradient. A one-tensor output is its own leaf ("") without
        the leaves walk."""
        port, store = self.port, self.port.store
        table = store.table(name)  # compiled code looks states up here, not by the name (StateStore.table)
        outputs = {}  # (leaf, call, phase) -> StateStore.bound() arguments of the output's state (eager)
        taps = {}  # (leaf, call, phase) -> GradTap of the gradient flowing back into that output

        def read(out, call, phase, compiling, recompute):
            for leaf, t in (("", out),) if isinstance(out, torch.Tensor) else tensor_leaves(out):
                where = (leaf, call, phase)
                if values and not recompute:
                    bound = None if compiling else outputs.get(where)
                    if bound is None or not store.update(t, bound):
                        key = (name, Kind.OUTPUT, leaf, call) if compiling else TargetKey(name, Kind.OUTPUT, leaf, call)
                        bound = port.measure_in(key, t, phase,
                                                keep=not compiling, compiling=compiling, table=table)
                        if bound is not None:
                            outputs[where] = bound
                if grads and compiling:  # compiled code keeps no Python objects between calls
                    tap_grad(port, (name, Kind.GRAD_OUTPUT, leaf, call), t, phase, table)  # key_parts' tuple
                elif grads:
                    tap = taps.get(where)
                    if tap is None:
                        tap = taps[where] = GradTap(port, TargetKey(name, Kind.GRAD_OUTPUT, leaf, call), phase)
                    tap(t)
        return read

    def measure(self, key, t, phase, compiling=None, table=None):
        self.port.measure_in(key, t, phase, compiling=compiling, table=table)

    def watch(self, name, t):
        return watch(self.port, name, t)
