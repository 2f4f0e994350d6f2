"""Activation checkpointing inside a compiled region: Dynamo traces the checkpointed block as a subgraph that may
change no Python state, and the hooks' first compiled call does (states marked reached, the input-gradient calls),
so Dynamo breaks the graph there and runs the block eagerly. The monitor says so once, naming the fix; with the fix
(skip_fwd_side_effects_in_bwd_under_checkpoint) the forward compiles whole, and every target is measured as the
test's own float64 hooks on an eager twin see it (tests/zoo_oracle.py)."""
import warnings

import pytest
import torch
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters
from torch.utils.checkpoint import checkpoint

import hookstats
from zoo_oracle import Oracle, assert_moments_agree, train_steps

SAID = "ran an activation-checkpointed region eagerly"


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 8)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Linear(4, 8)
        self.block = Block()
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(checkpoint(self.block, self.emb(x), use_reentrant=False))



def train(model, xs, forward=None, oracle=None):
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        train_steps(model.parameters(), xs, model if forward is None else forward, oracle)
    return [str(w.message) for w in said if SAID in str(w.message)]


def hop_breaks():
    return sum(n for reason, n in counters["graph_break"].items() if "HOP" in reason)


@pytest.mark.parametrize("input_grads", [False, True])
def test_a_checkpointed_region_run_eagerly_is_said_once_with_the_fix(fresh_dynamo, input_grads):
    torch.manual_seed(0)
    model = Net()
    xs = [torch.randn(3, 4) for _ in range(3)]
    with hookstats.attach(model, input_grads=input_grads):
        said = train(model, xs, torch.compile(model, backend="aot_eager"))
    assert hop_breaks() >= 1  # what the warning is about: Dynamo broke the graph at the checkpoint
    assert len(said) == 1 and "skip_fwd_side_effects_in_bwd_under_checkpoint" in said[0]


def test_with_the_fix_the_forward_compiles_whole_and_measures_as_eager_hooks_do(fresh_dynamo):
    torch.manual_seed(0)
    model, ref = Net(), Net()
    ref.load_state_dict(model.state_dict())
    xs = [torch.randn(3, 4) for _ in range(3)]
    names = {n: m for n, m in ref.named_modules() if n and any(True for _ in m.parameters(recurse=False))}
    oracle = Oracle(ref, names, input_grads=tuple(names))
    train(ref, xs, oracle=oracle)
    oracle.remove()

    counter = CompileCounterWithBackend("aot_eager")
    with torch._dynamo.config.patch(skip_fwd_side_effects_in_bwd_under_checkpoint=True):
        with hookstats.attach(model, input_grads=True) as mon:
            said = train(model, xs, torch.compile(model, backend=counter))
            got = mon.stats()
    assert said == [] and hop_breaks() == 0 and counter.frame_count == 1
    want = oracle.targets("train")
    assert "block.fc1:grad_input" in want and set(got) == want
    assert_moments_agree(oracle, got, want, mon.cfg, atol=1e-6)
