"""What the Paddle hooks measure through the bridge: one tensor now (measure), and the gradient flowing back into
a tensor through Paddle's Tensor.register_hook (tap_grad). Both feed the engine's Port and StateStore."""
import paddle

from ..hooks.grad_taps import tell_split_step
from . import bridge


class Taps:
    """The Paddle side of one monitor's Port: converts each tensor (bridge.as_torch, no copy) and hands it to
    the same accumulate path the torch hooks use. Hooks return None: nothing they see is changed."""

    def __init__(self, port):
        self.port, self.store, self.clock = port, port.store, port.clock
        self.order = bridge.StreamOrder()

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

    def measure(self, key, t, phase):
        device = self.readable(key, t)
        if device is not None:
            self.order.run(t.place, device, lambda: self.port.measure_in(key, bridge.as_torch(t), phase,
                                                                          compiling=False))

    def tap_grad(self, key, t, phase):
        """Measures the gradient of the loss w.r.t. t when it arrives in backward."""
        if t.stop_gradient:
            return
        device = self.readable(key, t)
        if device is None:
            return
        store, clock, order, tell = self.store, self.clock, self.order, self.port.tell
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
