"""A step that ends in one thread while another thread's forward is measured: nothing measured may be lost
(stats() and the history against hooks of the test's own)."""
import threading

import numpy as np
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

import hookstats


class InsideStepEnd(TorchFunctionMode):
    """In the thread ending a step: before the history's step end's `at`-th _foreach_copy_ (1: closing the open
    step into the running totals, 2: emptying the open step), another thread runs `other`, and this thread
    waits for it (2 s at most: with the step end exclusive, `other` waits for the step end)."""

    def __init__(self, other, at=1):
        super().__init__()
        self.other_fn, self.at, self.seen = other, at, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") == "_foreach_copy_":
            self.seen += 1
        if self.seen == self.at and not hasattr(self, "other"):
            t = threading.Thread(target=self.other_fn)
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
        mode = InsideStepEnd(lambda: model(xs[1]))
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


def test_stats_in_another_thread_during_a_step_end_counts_the_open_step_once():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6))
    g = torch.Generator().manual_seed(2)
    xs = [torch.randn(3, 4, generator=g) + k for k in range(2)]
    with torch.no_grad():
        want = np.concatenate([model(x).double().reshape(-1).numpy() for x in xs])
    mon = hookstats.attach(model, steps="manual", history=True, log_every=1, grads=False)
    got = {}
    with torch.no_grad():
        for x in xs:
            model(x)
        mode = InsideStepEnd(lambda: got.update(mon.stats()), at=2)
        with mode:
            mon.step()
        mode.other.join()
    s = got["0:output"]
    assert s["count"] == s["finite"] == want.size == 36
    np.testing.assert_allclose(s["mean"], want.mean(), rtol=1e-6)
    np.testing.assert_allclose(s["std"], want.std(ddof=1), rtol=1e-5)
    mon.remove()
