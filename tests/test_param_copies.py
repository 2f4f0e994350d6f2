"""reduce() counts a parameter copied on every rank once: DDP's weights and all-reduced gradients (params=True,
param_grads=True) merge to the statistics of one copy, while weights that differ between ranks, and FSDP2 shards that
hold equal values, are merged over the ranks; under HSDP, reduce(mesh=..., tp="shard") counts them once. 2 and 4
gloo processes; the oracle is each rank's float64 record of the
tensors it held at each optimizer step (torch's own DDP gradients and FSDP2 full_tensor())."""
import numpy as np
import pytest
import torch
from torch import nn

import hookstats
from hookstats import layout
from helpers import oracle
import spawn_ranks

CFG = dict(nbins=16, lo=-1.0, hi=1.0, hist_every=1)
pytestmark = pytest.mark.slow  # spawned process groups (tens of seconds): .ci/run runs them


def net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 2))


def train(model, params_of, rank, steps=3, **reduce_args):
    """Steps of SGD on a batch of this rank's; {target: float64 values} of each parameter's gradient before and its
    weights after every optimizer step, as params_of(model) gives them (name, weights, gradient), and the stats of
    mon.reduce(**reduce_args)."""
    mon = hookstats.attach(model, outputs=False, grads=False, params=True, param_grads=True, **CFG)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    seen = {}
    for step in range(steps):
        x = torch.randn(3, 5, generator=torch.Generator().manual_seed(10 * step + rank))
        model(x).square().sum().backward()
        for name, _, grad in params_of(model):
            if grad is not None:
                seen.setdefault(f"{name}:param_grad", []).append(grad.double().reshape(-1))
        opt.step()
        opt.zero_grad()
        for name, weights, _ in params_of(model):
            seen.setdefault(f"{name}:param", []).append(weights.double().reshape(-1))
    stats = mon.reduce(**reduce_args).stats()
    mon.remove()
    return {"seen": {k: torch.cat(v) for k, v in seen.items()}, "stats": stats}


def plain(model):
    return [(n, p.detach().clone(), None if p.grad is None else p.grad.clone()) for n, p in model.named_parameters()]


def whole(model):
    return [(n, p.detach().full_tensor(), None if p.grad is None else p.grad.full_tensor())
            for n, p in model.named_parameters()]


def worker(rank, world):
    from torch.distributed.fsdp import fully_shard
    ddp = nn.parallel.DistributedDataParallel(net())
    res = {"ddp": train(ddp, plain, rank), "own": train(net(seed=rank), plain, rank)}
    sharded = net()
    nn.init.zeros_(sharded[2].bias)
    sharded[2].bias.requires_grad_(False)  # frozen at zero: each rank's shard [0.] (params=True measures it)
    fully_shard(sharded[0])
    fully_shard(sharded[2])
    fully_shard(sharded)
    res["fsdp"] = train(sharded, whole, rank)
    return res


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return spawn_ranks.run(worker, 2, tmp_path_factory.mktemp("copies"))


def assert_is(rec, x, target):
    cfg = hookstats.StatsConfig(**CFG)
    f, i = oracle(x, cfg)
    assert rec["count"] == x.numel(), target
    assert abs(rec["mean"] - f[layout.MEAN]) <= 1e-6 * (abs(f[layout.MEAN]) + x.std().item()), target
    if x.numel() > 1:
        np.testing.assert_allclose(rec["std"], x.std().item(), rtol=1e-6, err_msg=target)  # n - 1 of one copy
    np.testing.assert_allclose([rec["min"], rec["max"]], f[layout.MIN:], rtol=1e-6, err_msg=target)
    lin = i[layout.LIN_BASE: layout.LIN_BASE + layout.lin_slots(cfg.nbins)]
    np.testing.assert_array_equal(rec["hist"], lin[1: cfg.nbins + 1], err_msg=target)


def test_ddp_weights_and_gradients_are_counted_once(ranks):
    seen = ranks[0]["ddp"]["seen"]
    assert len(seen) == 8
    for r in ranks:
        for target, x in seen.items():
            torch.testing.assert_close(r["ddp"]["seen"][target], x, rtol=0, atol=0)  # copies indeed
            assert_is(r["ddp"]["stats"][target], x, target)


def test_weights_that_differ_between_ranks_are_merged(ranks):
    for target in ranks[0]["own"]["seen"]:
        x = torch.cat([r["own"]["seen"][target] for r in ranks])
        assert_is(ranks[0]["own"]["stats"][target], x, target)


def test_fsdp_shards_are_merged_even_when_equal(ranks):
    seen = ranks[0]["fsdp"]["seen"]
    assert torch.equal(seen["2.bias:param"], torch.zeros(6, dtype=torch.float64))  # [0., 0.] over 3 steps
    for target, x in seen.items():  # full_tensor(): the whole parameter, once
        assert_is(ranks[0]["fsdp"]["stats"][target], x, target)


class Stage(nn.Module):
    """One pipeline stage's layer under its name in the whole model (ranks of the other stage hold the other)."""

    def __init__(self, name):
        super().__init__()
        self.name = name
        self.add_module(name, net().get_submodule(name))

    def forward(self, x):
        layer = self.get_submodule(self.name)
        return layer(x[:, : layer.in_features])


def four_rank_worker(rank, world):
    """HSDP: fully_shard on a 2 x 2 mesh of replicate by shard ranks, each replica its own batches; and two pipeline
    stages of DDP over 2 ranks each (ranks 0 and 2 hold layer 0, ranks 1 and 3 layer 2)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    model = net()
    for part in (model[0], model[2], model):
        fully_shard(part, mesh=mesh)
    stage_groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    stage = nn.parallel.DistributedDataParallel(Stage("0" if rank % 2 == 0 else "2"), process_group=stage_groups[rank % 2])
    return {"hsdp": train(model, whole, rank, mesh=mesh, tp="shard"), "stages": train(stage, plain, rank)}


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    return spawn_ranks.run(four_rank_worker, 4, tmp_path_factory.mktemp("four"))


def test_hsdp_parameters_are_counted_once_over_the_mesh_naming_the_shard_dimension(four_ranks):
    seen = four_ranks[0]["hsdp"]["seen"]
    for r in four_ranks:
        for target, x in seen.items():
            torch.testing.assert_close(r["hsdp"]["seen"][target], x, rtol=0, atol=0)  # every replica holds the same
            assert_is(r["hsdp"]["stats"][target], x, target)


def test_each_pipeline_stage_s_ddp_copies_are_counted_once(four_ranks):
    stats = four_ranks[0]["stages"]["stats"]
    assert len(stats) == 8  # both stages' weights and gradients
    for first in four_ranks[:2]:  # ranks 0 and 1: the first of each stage's data-parallel pair
        for target, x in first["stages"]["seen"].items():
            assert_is(stats[target], x, target)
