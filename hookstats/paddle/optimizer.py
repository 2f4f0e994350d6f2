"""Parameter gradients of a Paddle model (param_grads=True): Paddle has no global optimizer hook, so the
optimizer given to attach() has its step() wrapped on the instance: each selected parameter's gradient is
measured once per optimizer step, just before the update, after any gradient accumulation."""
import paddle

from ..phases import Phase
from ..targets import Kind, TargetKey
from . import bridge


class OptimizerGrads:
    """The wrapped step of one optimizer; remove() restores the optimizer's own step. Frozen parameters
    (stop_gradient=True) and parameters without a gradient yet are left out."""

    def __init__(self, port, named_params, optimizer):
        if not isinstance(optimizer, paddle.optimizer.Optimizer):
            raise ValueError("param_grads=True with a Paddle model needs optimizer=, the paddle.optimizer.Optimizer "
                             "whose step() ends each update (Paddle has no global optimizer hook), got "
                             f"{type(optimizer).__name__}")
        self.store, self.clock, self.tell = port.store, port.clock, port.tell
        self.order = bridge.StreamOrder()
        self.params = {}  # id(param) -> (key, param); the structure check reads the ids
        for name, p in named_params:
            if self.takes(p) and id(p) not in self.params:
                self.params[id(p)] = (TargetKey(name, Kind.PARAM_GRAD, "", None), p)
        for key, p in self.params.values():
            self.store.resolve(key, bridge.torch_device(p.place), Phase.TRAIN, reach=False)
        self.optimizer, own_step = optimizer, optimizer.step

        def step(*args, **kwargs):
            self.measure()
            return own_step(*args, **kwargs)
        self.step = step
        optimizer.step = step

    @staticmethod
    def takes(p):
        """Whether a parameter's gradient is measured (also the structure check's rule)."""
        return not p.stop_gradient and p.dtype in bridge.MEASURED_DTYPES

    def measure(self):
        """One multi-tensor op per device over the gradients there."""
        if not self.clock.sampling:
            return
        self.clock.eager_point()
        by_place = {}
        for key, p in self.params.values():
            g = p.grad
            if g is None:
                continue
            if g.is_selected_rows() or g.is_sparse():  # nn.Embedding(sparse=True): the op reads dense tensors
                self._unread(key, bridge.unread_reason(g))
                continue
            by_place.setdefault(str(g.place), []).append((key, g))
        for items in by_place.values():
            place = items[0][1].place
            device = bridge.torch_device(place)
            if device is None:
                for key, _ in items:
                    self._unread(key, bridge.no_kernel(place))
                continue
            sts = [self.store.resolve(key, device, Phase.TRAIN, compiling=False)[0] for key, _ in items]
            self.order.run(place, device, lambda: self.store.accumulate_many(
                [bridge.as_torch(g) for _, g in items], sts, device))

    def _unread(self, key, why):
        self.tell(f"unread:{key.id}", f"hookstats: {key.id} is not measured: its gradient is {why}")

    def flush(self):
        """Nothing to measure at mon.step(): the optimizer's step() measured the gradients already."""

    def tell_if_never_measured(self):
        """Nothing to say: a parameter without a gradient is left out at each step."""

    def remove(self):
        if self.optimizer is not None and vars(self.optimizer).get("step") is self.step:
            del self.optimizer.step
        self.optimizer = None
