"""Parameter gradients (param_grads=True): held when accumulated, measured once per optimizer step."""
import torch
from torch.nn.parameter import is_lazy

from ..phases import Phase
from ..targets import Kind, TargetKey
from ..tensors import measured, unread_reason
from .handles import weakly


class ParamGrads:
    """Parameter gradients after accumulation, one state per parameter, measured once per optimizer step.

    A post-accumulate-grad hook holds the gradient it was called with (no device work per micro-batch: only
    the last accumulation of an optimizer step is measured); the held gradients of the parameters an optimizer
    steps are measured with one multi-tensor op per device just before it steps (the step clock's
    before_optimizer: no optimizer has to be passed), or at mon.step() for loops without a torch.optim
    optimizer. Measuring the held tensor, not `p.grad`, keeps a hand-written update that sets `p.grad = None`
    before mon.step() from losing them; one changed in place before mon.step() is measured as changed, said
    once. Frozen parameters (requires_grad=False) get no hook and no state.
    """

    def __init__(self, port, named_params):
        self.store, self.clock, self.tell = port.store, port.clock, port.tell
        self.params = {}  # id(param) -> (key, param)
        meta = [name for name, p in named_params if p.device.type == "meta"]
        if meta:
            raise ValueError(f"param_grads=True: parameters {meta[:4]} are on the meta device; materializing them "
                             "(to_empty) makes new parameter objects, which would never be measured: attach after it")
        lazy = [name for name, p in named_params if is_lazy(p)]
        if lazy:
            raise ValueError(f"param_grads=True: parameters {lazy[:4]} are not initialized yet (a lazy module such as "
                             "LazyLinear), and a gradient hook needs the parameter: run one forward (a dummy batch) "
                             "before attach")
        for name, p in named_params:
            if self.takes(p) and id(p) not in self.params:
                self.params[id(p)] = (TargetKey(name, Kind.PARAM_GRAD, "", None), p)
        self.fresh = {}  # id(param) -> (param, its gradient when accumulated, the gradient's version then)
        self.unsampled = 0  # optimizer steps with fresh gradients in unsampled steps, while none was measured
        self.handles = [weakly(self._mark, p.register_post_accumulate_grad_hook) for _, p in self.params.values()]
        self.clock.before_optimizer.append(self.before_optimizer)
        for key, p in self.params.values():
            self.store.resolve(key, p.device, Phase.TRAIN, reach=False)

    @staticmethod
    def takes(p):
        """Whether a parameter gets a gradient hook and a state (also the structure check's rule)."""
        return p.requires_grad and p.is_floating_point()

    def _mark(self, p):
        g = p.grad
        self.fresh[id(p)] = (p, g, None if g is None or torch.compiler.is_compiling() else g._version)

    def before_optimizer(self, optimizer, ids):
        self.flush(ids, changed_ok=True)

    def flush(self, ids=None, changed_ok=False):
        """Measures the fresh gradients (of `ids`, default all) and forgets them. changed_ok: a gradient
        changed in place since its backward is what an optimizer steps with (clipped, unscaled), not a loss."""
        ids = list(self.fresh) if ids is None else [i for i in ids if i in self.fresh]
        if not ids:
            return
        self.flushed = True
        by_dev = {}
        if not self.clock.sampling and self.unsampled >= 0:
            self.unsampled += 1
            if self.unsampled > self.clock.every:
                self.unsampled = -1  # said once
                self.tell("param_grads_unsampled", (
                   f"hookstats: param_grads=True has measured nothing in {self.clock.every + 1} optimizer steps: each "
                   f"fell on a step that every={self.clock.every} does not sample (a step is a train forward, and "
                   "gradient accumulation runs several per optimizer step). Count steps with steps='manual' and "
                   "mon.step() after each optimizer step, or pick an every that the forwards per step do not divide."))
        elif self.clock.sampling:
            self.unsampled = -1
        compiling = torch.compiler.is_compiling()
        changed = []
        for i in ids:
            p, g, version = self.fresh.pop(i)
            if not self.clock.sampling or g is None:
                continue
            if not changed_ok and version is not None and g._version != version:
                changed.append(self.params[i][0].module)
            x = measured(g)  # a DTensor (FSDP2): this rank's shard
            if x is None:
                if (why := unread_reason(g)) is not None:  # nn.Embedding(sparse=True): a sparse COO gradient
                    key = self.params[i][0]
                    self.tell(f"unread:{key.id}", f"hookstats: {key.id} is not measured: its gradient is {why}")
                continue
            if x is not g and not compiling:
                self.store.note_placement(self.params[i][0], g)
            target = self.store.resolve(self.params[i][0], x.device, Phase.TRAIN, compiling=compiling)
            if target is not None:
                by_dev.setdefault(x.device, []).append((x, target[0]))
        for dev, items in by_dev.items():
            self.store.accumulate_many([g for g, _ in items], [st for _, st in items], dev)
        if changed:
            self.tell("param_grads_changed", (
                f"hookstats: parameter gradients ({', '.join(changed[:3])}{', ...' if len(changed) > 3 else ''}) "
                "were changed in place between their backward and mon.step() (zero_grad(set_to_none=False), "
                "clipping, an in-place update): measured as they are now. Call mon.step() before changing them, "
                "or set p.grad = None instead of zeroing it."))

    flushed = False  # some optimizer step or mon.step() came to measure fresh gradients

    def tell_if_never_measured(self):
        """Gradients computed that nothing came to measure: a loop without a torch.optim optimizer and
        without mon.step() (a hand-written update) would otherwise measure no parameter gradient in silence."""
        if self.fresh and not self.flushed and self.clock.step_count >= 2:  # a first step may not have stepped yet
            self.tell("param_grads_never", (
                "hookstats: param_grads=True has measured no parameter gradient: they are measured when a "
                "torch.optim optimizer steps or at mon.step(), and neither happened; call mon.step() after each "
                "update of a loop without a torch.optim optimizer."))

    def clear(self):
        self.fresh.clear()

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles.clear()
        if self.before_optimizer in self.clock.before_optimizer:
            self.clock.before_optimizer.remove(self.before_optimizer)
        self.fresh.clear()
