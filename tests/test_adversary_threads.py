"""A step that ends in one thread while another thread's forward is measured: nothing measured may be lost
(stats() and the history against hooks of the test's own)."""
import threading

import numpy as np
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

import hookstats


class ForwardInsideStepEnd(TorchFunctionMode):
    """In the thread ending a step: when the history's step end first resets states (a _foreach_copy_), another
    thread runs one train forward, and this thread waits for it (2 s at most: with the step end exclusive,
    that forward waits for the step end and is measured in the next step)."""

    def __init__(self, forward):
        super().__init__()
        self.forward, self.fired = forward, False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if not self.fired and getattr(func, "__name__", "") == "_foreach_copy_":
            self.fired = True
            t = threading.Thread(target=self.forward)
            t.start()
            t.join(timeout=2.0)
            self.other = t
        return func(*args, **(kwargs or {}))


def test_a_forward_in_another_thread_during_a_step_end_is_not_lost():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6))
    mon = hookstats.attach(model, steps="manual", history=True, log_every=1, grads=False)
    seen, lock = [], threading.Lock()

    def own(module, args, out):
        with lock:
            seen.append(out.detach().double().reshape(-1).numpy().copy())

    model[0].register_forward_hook(own)
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(3, 4, generator=g) * (1 + k) for k in range(3)]
    with torch.no_grad():
        model(xs[0])
        mode = ForwardInsideStepEnd(lambda: model(xs[1]))
        with mode:
            mon.step()
        mode.other.join()
        model(xs[2])
        mon.step()
    v = np.concatenate(seen)
    s = mon.stats()["0:output"]
    assert s["count"] == v.size == 54
    assert s["min"] == v.min() and s["max"] == v.max()
    np.testing.assert_allclose(s["mean"], v.mean(), rtol=1e-6)
    np.testing.assert_allclose(s["std"], v.std(ddof=1), rtol=1e-5)
    h = mon.history()
    counts = [v for t, st, v in zip(h["target"], h["stat"], h["value"]) if t == "0:output" and st == "count"]
    assert sum(counts) == 54, counts
    mon.remove()
