"""The parts of tensor-parallel measuring that one process can check (tests/test_tensor_parallel.py runs 4): an
AsyncCollectiveTensor output and the gradient into it measured against plain float64 hooks, a Partial DTensor
left out with one clear warning, and the placement rule of reduce(mesh=...) on states made up here."""
import tempfile
import warnings

import pytest
import torch
import torch.distributed as dist
from torch import nn

import hookstats
from hookstats import rawstate, replicas
from helpers import no_host_sync


@pytest.fixture(scope="module")
def one_rank():
    from torch.distributed.device_mesh import init_device_mesh
    dist.init_process_group("gloo", init_method=f"file://{tempfile.mkdtemp()}/store", rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
    finally:
        dist.destroy_process_group()


class Gathered(nn.Module):
    """A Linear whose output goes through a functional collective, as a row-parallel layer's does."""

    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x):
        import torch.distributed._functional_collectives as funcol
        gather = getattr(funcol, "all_gather_single_autograd", None) or funcol.all_gather_tensor_autograd
        return gather(self.lin(x), 0, dist.group.WORLD)


def test_an_async_collective_output_and_its_gradient_are_measured(one_rank):
    torch.manual_seed(0)
    model = nn.Sequential(Gathered(5), nn.Tanh(), Gathered(5))
    seen = {}

    def keep(name):
        def hook(module, args, out):
            assert type(out).__name__ == "AsyncCollectiveTensor"  # what the case is about
            seen.setdefault(f"{name}:output", []).append(out.detach().double().reshape(-1))
            out.register_hook(lambda g: seen.setdefault(f"{name}:grad_output", []).append(g.double().reshape(-1)))
        return hook

    for name in ("0", "2"):
        model.get_submodule(name).register_forward_hook(keep(name))
    with warnings.catch_warnings(record=True) as told:
        warnings.simplefilter("always")
        with hookstats.attach(model, modules=["0", "2"]) as mon:
            for _ in range(2):
                (model(torch.randn(3, 5)) ** 2).sum().backward()
    assert [str(w.message) for w in told if "not measured" in str(w.message)] == []
    stats = mon.stats()
    assert set(stats) == set(seen)
    for target, parts in seen.items():
        x = torch.cat(parts)
        assert stats[target]["count"] == x.numel(), target
        assert stats[target]["mean"] == pytest.approx(x.mean().item(), rel=1e-6, abs=1e-7), target
        assert stats[target]["std"] == pytest.approx(x.std().item(), rel=1e-6), target
        assert (stats[target]["min"], stats[target]["max"]) == pytest.approx((x.min().item(), x.max().item())), target


def test_the_hook_waits_with_the_collective_s_own_wait_and_reads_nothing_on_the_host(one_rank):
    model = nn.Sequential(Gathered(5), nn.Tanh(), Gathered(5))
    with hookstats.attach(model, modules=["0", "2"]) as mon:
        model(torch.randn(3, 5)).sum().backward()  # first call: states allocated outside the checked region
        with no_host_sync() as ops:
            model(torch.randn(3, 5)).sum().backward()
    assert any("wait_tensor" in op for op in ops)  # the checked region did run the collectives' waits
    assert mon.stats()["0:output"]["count"] == 30


class Partial(nn.Module):
    """A row-parallel matmul's output before its reduction, what a hook registered before parallelize_module's sees."""

    def __init__(self, mesh):
        super().__init__()
        self.weight, self.mesh = nn.Parameter(torch.randn(4, 4)), mesh

    def forward(self, x):
        from torch.distributed.tensor import DTensor, Partial as PartialPlacement
        return DTensor.from_local(x @ self.weight, self.mesh, [PartialPlacement()])


def test_a_partial_dtensor_is_not_measured_and_said_once(one_rank):
    model = Partial(one_rank["tp"])
    with hookstats.attach(model, grads=False) as mon:
        with pytest.warns(RuntimeWarning, match="Partial placement.*attach after parallelize_module") as told:
            model(torch.randn(2, 4))
            model(torch.randn(2, 4))
    assert len([w for w in told if "Partial" in str(w.message)]) == 1
    assert [st for k, _, st in mon.states() if k.id == ":output"] == []


def test_states_alike_bit_for_bit_have_one_fingerprint_and_any_difference_changes_it():
    f, i = rawstate.empty(40, shape=(4,))
    f[:, 0], f[:, 1], f[:, 2], f[:, 3], f[:, 4] = 10, 0.5, 3.0, -1.0, 2.0
    i[:] = torch.arange(40)
    i[1, 7] += 1  # one histogram slot
    f[2, 2] = torch.nextafter(f[2, 2], torch.tensor(4.0, dtype=torch.float64))  # M2 one ulp apart
    fp = replicas.fingerprints(f, i)
    assert torch.equal(fp[0], fp[3])
    assert not torch.equal(fp[0], fp[1]) and not torch.equal(fp[0], fp[2])


def test_only_the_first_tp_rank_keeps_a_replicated_target():
    f, i = rawstate.empty(6, shape=(2,))
    f[:] = torch.tensor([3.0, 0.5, 2.0, -1.0, 1.0], dtype=torch.float64)
    i[:] = 7
    same = torch.tensor([True, False])
    kept = replicas.keep_one_copy(f, i, same, first=True)
    assert torch.equal(kept[0], f) and torch.equal(kept[1], i)
    kf, ki = replicas.keep_one_copy(f, i, same, first=False)
    empty_f, empty_i = rawstate.empty(6)
    assert torch.equal(kf[0].nan_to_num(), empty_f.nan_to_num()) and torch.equal(ki[0], empty_i)
    assert torch.equal(kf[1], f[1]) and torch.equal(ki[1], i[1])


def test_reduce_over_a_one_rank_mesh_is_the_local_state_and_says_what_it_found_replicated(one_rank):
    model = nn.Sequential(nn.Linear(4, 4))
    with hookstats.attach(model, grads=False) as mon:
        model(torch.randn(3, 4))
    merged = mon.reduce(mesh=one_rank, tp="tp")
    assert merged.stats()["0:output"]["count"] == mon.stats()["0:output"]["count"] == 12
    assert merged.replicated == {"0:output"}  # one TP rank: every target is trivially alike over the group


def test_reduce_with_a_bad_mesh_is_one_clear_error(one_rank):
    with hookstats.attach(nn.Linear(2, 2)) as mon:
        with pytest.raises(ValueError, match="must be a torch.distributed DeviceMesh"):
            mon.reduce(mesh="tp")
        with pytest.raises(ValueError, match=r"no dimension named 'model' \(its dimensions: \('dp', 'tp'\)\)"):
            mon.reduce(mesh=one_rank, tp="model")
        with pytest.raises(ValueError, match="give group= or mesh=, not both"):
            mon.reduce(group=dist.group.WORLD, mesh=one_rank)


def test_the_rule_declared_beats_placement_beats_alike_states(one_rank):
    f, i = rawstate.empty(6, shape=(4,))
    f[:] = torch.tensor([3.0, 0.5, 2.0, -1.0, 1.0], dtype=torch.float64)  # one TP rank: every state alike
    U, R, S = replicas.UNKNOWN, replicas.REPLICATED, replicas.SHARDED
    placed, declared = torch.tensor([U, S, R, S]), torch.tensor([U, U, U, R])
    same, how = replicas.decide(f, i, one_rank.get_group("tp"), placed, declared)
    assert same.tolist() == [True, False, True, True]
    assert how.tolist() == [0, 1, 1, 2]  # states, placement, placement, declared


def sequence_parallel_norm(mesh):
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, SequenceParallel, parallelize_module
    model = nn.Sequential(nn.LayerNorm(4), nn.Linear(4, 4))  # the norm's output a DTensor, the Linear's plain
    parallelize_module(model, mesh["tp"], {"0": SequenceParallel(), "1": ColwiseParallel(input_layouts=Shard(1))})
    return model


def test_a_dtensor_placement_decides_and_a_declaration_overrides_it(one_rank):
    model = sequence_parallel_norm(one_rank)
    with hookstats.attach(model) as mon:
        assert type(model[0](torch.randn(2, 3, 4))).__name__ == "DTensor"  # what the case is about
        model(torch.randn(2, 3, 4)).sum().backward()
    placed = mon.reduce(mesh=one_rank, tp="tp")
    assert placed.placement_source == {"0:output": "placement", "0:grad_output": "placement",
                                       "1:output": "states", "1:grad_output": "states"}
    assert placed.replicated == {"1:output", "1:grad_output"}  # Shard(1) over tp: sharded, though alike
    declared = mon.reduce(mesh=one_rank, tp="tp", replicated=["0:*"], sharded="1:grad_output")
    assert declared.placement_source == {"0:output": "declared", "0:grad_output": "declared",
                                         "1:output": "states", "1:grad_output": "declared"}
    assert declared.replicated == {"0:output", "0:grad_output", "1:output"}


def test_bad_declarations_are_one_clear_error(one_rank):
    model = nn.Sequential(nn.Linear(2, 2))
    with hookstats.attach(model, grads=False) as mon:
        model(torch.randn(1, 2))
        with pytest.raises(ValueError, match=r"no target matches \['\*.up:output'\].*such as 0:output"):
            mon.reduce(mesh=one_rank, tp="tp", sharded=["*.up:output"])
        with pytest.raises(ValueError, match="0:output matches both sharded= and replicated="):
            mon.reduce(mesh=one_rank, tp="tp", sharded=["0:*"], replicated=["*:output"])
        with pytest.raises(ValueError, match=r"sharded= takes glob patterns of target ids .*got 3"):
            mon.reduce(mesh=one_rank, tp="tp", sharded=[3])
        with pytest.raises(ValueError, match="give mesh=world_mesh"):
            mon.reduce(replicated=["0:output"])
