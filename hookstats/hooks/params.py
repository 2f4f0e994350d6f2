"""Parameter values (params=True): each parameter's weights measured right after the optimizer step that made
them, once per optimizer step, with one multi-tensor op per device and no host read."""
import torch

from ..phases import Phase
from ..targets import Kind, TargetKey
from ..tensors import measured


class ParamValues:
    """The weights themselves, one state per parameter ("fc1.weight:param"), as wandb.watch(log="all") logs them.

    After an optimizer steps (the step clock's after_optimizer: no optimizer has to be passed, several are fine)
    the parameters that optimizer holds are measured: the weights its step produced. mon.step() measures those no
    optimizer measured in the step that it ends (loops without torch.optim, frozen parameters). Frozen parameters
    (requires_grad=False) are measured too, once per step, at the first optimizer step or mon.step() of it.
    Gradient accumulation measures once per optimizer step, since the micro-batches step no optimizer.
    Cadence: the steps every=N samples, histograms on the histogram steps (clock.is_hist_step), as every other target.
    """

    @staticmethod
    def takes(p):
        """Whether a parameter is measured (also the structure check's rule)."""
        return p.is_floating_point()

    def __init__(self, port, named_params):
        self.store, self.clock, self.tell = port.store, port.clock, port.tell
        self.params = {}  # id(param) -> (key, param)
        meta = [name for name, p in named_params if p.device.type == "meta"]
        if meta:
            raise ValueError(f"params=True: parameters {meta[:4]} are on the meta device; materializing them "
                             "(to_empty) makes new parameter objects, which would never be measured: attach after it")
        for name, p in named_params:
            if self.takes(p) and id(p) not in self.params:
                self.params[id(p)] = (TargetKey(name, Kind.PARAM, "", None), p)
        self.measured_in = {}  # id(param) -> the step it was last measured in
        self.measured_any = False
        self.clock.after_optimizer.append(self.after_optimizer)
        for key, p in self.params.values():
            self.store.resolve(key, p.device, Phase.TRAIN, reach=False)

    def after_optimizer(self, optimizer, ids):
        ids = [i for i in ids if i in self.params]
        if ids:
            step = self.clock.step_count
            frozen = [i for i, (_, p) in self.params.items()
                      if not p.requires_grad and self.measured_in.get(i) != step]
            self.measure(ids + [i for i in frozen if i not in ids])

    def flush(self):
        """At mon.step(): the parameters no optimizer measured in the step being ended."""
        step = self.clock.step_count
        self.measure([i for i in self.params if self.measured_in.get(i) != step])

    def measure(self, ids):
        step = self.clock.step_count
        self.measured_any = True
        by_dev = {}
        compiling = torch.compiler.is_compiling()
        for i in ids:
            self.measured_in[i] = step
            key, p = self.params[i]
            p = p.detach()
            x = measured(p)  # a DTensor (FSDP2): this rank's shard
            if x is None or not self.clock.sampling:
                continue
            if x is not p and not compiling:
                self.store.note_placement(key, p)
            target = self.store.resolve(key, x.device, Phase.TRAIN, compiling=compiling)
            if target is not None:
                by_dev.setdefault(x.device, []).append((x, target[0]))
        for dev, items in by_dev.items():
            self.store.accumulate_many([x for x, _ in items], [st for _, st in items], dev)

    def tell_if_never_measured(self):
        """A loop without a torch.optim optimizer and without mon.step() would measure no weight in silence."""
        if self.params and not self.measured_any and self.clock.step_count >= 2:
            self.tell("params_never", (
                "hookstats: params=True has measured no parameter: they are measured after each torch.optim "
                "optimizer step or at mon.step(), and neither happened; call mon.step() after each update of a "
                "loop without a torch.optim optimizer."))

    def remove(self):
        if self.after_optimizer in self.clock.after_optimizer:
            self.clock.after_optimizer.remove(self.after_optimizer)
