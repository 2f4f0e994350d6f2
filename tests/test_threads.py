"""One model driven from several threads at once: forwards that overlap in time form one step, the calls of a
module in a step are numbered in the order they start, every target of one call agrees on its number, and
no update is lost (the op releases the GIL; updates of one state are serialized)."""
import threading

import torch
from torch import nn

import hookstats


class Meeting(nn.Linear):
    """A Linear whose forward waits until the other thread is inside it too: calls overlap every time."""

    def __init__(self, *args):
        super().__init__(*args)
        self.barrier = threading.Barrier(2, timeout=60)

    def forward(self, x):
        self.barrier.wait()
        return super().forward(x)


def test_two_threads_driving_one_model_keep_each_call_whole_and_lose_nothing():
    torch.manual_seed(0)
    model = nn.Sequential(Meeting(16, 64), nn.Tanh(), nn.Linear(64, 32))
    mon = hookstats.attach(model, separate_calls=True, inputs=True)
    batches = {0: torch.randn(8, 16), 1: torch.randn(3, 16)}  # sizes tell the threads' calls apart
    n = 150

    def work(i):
        for _ in range(n):
            model(batches[i]).sum().backward()

    threads = [threading.Thread(target=work, args=(i,)) for i in batches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = mon.stats()
    mon.remove()
    rows = n * sum(b.shape[0] for b in batches.values())
    for kind, width in (("input", 16), ("output", 64), ("grad_output", 64)):
        assert sum(r["count"] for tid, r in got.items() if tid.startswith(f"0:{kind}@")) == rows * width, kind
    # one call of layer 0 reads a batch of b rows: its input has 16 b values, its output and gradient 64 b,
    # whichever thread ran it and whatever the other thread did meanwhile
    calls = {r["call"] for r in got.values()}
    for k in calls:
        inp, out, grad = (got.get(f"0:{kind}@{k}", {"count": 0})["count"] for kind in ("input", "output", "grad_output"))
        assert out == grad == inp * 4, k
    assert mon.step_count <= 2 * n
