"""Regional compile (torchtitan's per-block compile: `for b in model.layers: b.compile()`): the blocks share one code
object, and Dynamo compiles one graph for all of them when nothing in it tells the blocks apart. hookstats' hooks
must not: a hook that looked its state up by the module's name made one graph per block, and past Dynamo's
recompile limit (8) the other blocks ran eagerly. The graphs are counted against the same loop without hookstats,
and every target is checked against the test's own hooks on an eager twin (tests/zoo_oracle.py)."""
import pytest
import torch
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend

import hookstats
from zoo_oracle import Oracle, assert_moments_agree, train_steps

LAYERS = 9  # more than Dynamo's recompile limit


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(16)
        self.fc1 = nn.Linear(16, 32)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(32, 16)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(self.ln(x))))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Linear(8, 16)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        h = self.emb(x)
        for b in self.layers:
            h = b(h)
        return self.head(h)



def train(model, xs, oracle=None):
    train_steps(model.parameters(), xs, model, oracle)


def compiled_graphs(model, xs):
    counter = CompileCounterWithBackend("aot_eager")
    for b in model.layers:
        b.compile(backend=counter)
    train(model, xs)
    return counter.frame_count


def test_blocks_compiled_on_their_own_share_one_graph_and_measure_as_eager_hooks_do(fresh_dynamo):
    torch.manual_seed(0)
    model, ref, plain = Net(), Net(), Net()
    ref.load_state_dict(model.state_dict())
    xs = [torch.randn(2, 5, 8, requires_grad=True) for _ in range(2)]
    want_graphs = compiled_graphs(plain, [x.detach().requires_grad_() for x in xs])
    torch._dynamo.reset()

    names = {n: m for n, m in ref.named_modules() if n and any(True for _ in m.parameters(recurse=False))}
    oracle = Oracle(ref, names, inputs=True, param_grads=True, input_grads=tuple(names))
    train(ref, [x.detach().requires_grad_() for x in xs], oracle)

    mon = hookstats.attach(model, inputs=True, input_grads=True, param_grads=True)
    assert compiled_graphs(model, xs) == want_graphs == 1
    got = mon.stats()
    want = oracle.targets("train")
    assert f"layers.{LAYERS - 1}.fc2:grad_output" in want and set(got) == want
    assert_moments_agree(oracle, got, want, mon.cfg, atol=1e-6)
    mon.remove()
