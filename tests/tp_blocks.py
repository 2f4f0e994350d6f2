"""The parallel tests' model, its plans and its data: two pre-norm transformer MLP blocks, parallelized as
torchtitan does (ColwiseParallel up projection, RowwiseParallel down projection; with sequence parallelism,
SequenceParallel on the norms) or split into pipeline stages as torchtitan splits (each stage keeps its own layers
under their names in the whole model), batches per data-parallel rank and step, and the loss."""
import torch
from torch import nn

D, H, SEQ, BATCH, STEPS = 8, 16, 4, 2, 2


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.up, self.act, self.down = nn.LayerNorm(D), nn.Linear(D, H), nn.GELU(), nn.Linear(H, D)

    def forward(self, x):
        return x + self.down(self.act(self.up(self.norm(x))))


def blocks():
    torch.manual_seed(0)
    return nn.Sequential(Block(), Block())


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleDict({"0": Block(), "1": Block()})

    def forward(self, x):
        for layer in self.layers.values():
            x = layer(x)
        return x


def stack():
    torch.manual_seed(0)
    return Stack()


def stage(model, index):
    """Pipeline stage `index` of a Stack: the whole model with every layer but its own deleted."""
    for name in [n for n in model.layers if n != str(index)]:
        del model.layers[name]
    return model


def batch(step, dp_rank):
    g = torch.Generator().manual_seed(1000 + 10 * step + dp_rank)
    return torch.randn(BATCH, SEQ, D, generator=g)


def loss_of(out):
    # a sum, not a mean: each value's gradient is the same however the batch is split over ranks
    return (out ** 2).sum()


def parallelize(model, tp_mesh, sequence_parallel):
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                                   parallelize_module)
    if sequence_parallel:
        plan = {"norm": SequenceParallel(), "up": ColwiseParallel(input_layouts=Shard(1)),
                "down": RowwiseParallel(output_layouts=Shard(1))}
    else:
        plan = {"up": ColwiseParallel(), "down": RowwiseParallel()}
    for block in model:
        parallelize_module(block, tp_mesh, plan)
    return model
