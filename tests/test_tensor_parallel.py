"""Tensor-parallel training on a 2 x 2 mesh (data x tensor, 4 gloo processes): mon.reduce(mesh=...) against one
process measuring the global batch with plain float64 hooks of its own, for every target. Three set-ups: tensor
parallel, tensor + sequence parallel, and FSDP2 on the data axis over tensor + sequence parallel (torchtitan's)."""
import warnings

import pytest

import hookstats
import spawn_ranks
import tp_blocks
import tp_oracle
from tp_blocks import SEQ, STEPS

CFG = dict(nbins=16, lo=-2.0, hi=2.0, hist_every=1)
DP, TP = 2, 2
MODES = ("tp", "sp", "fsdp_sp")
pytestmark = pytest.mark.slow  # spawned process groups (tens of seconds): .ci/run runs them


# ---------------- what each rank runs ----------------
def train(mode, mesh):
    from torch.distributed.fsdp import fully_shard
    model = tp_blocks.parallelize(tp_blocks.blocks(), mesh["tp"], sequence_parallel=mode != "tp")
    if mode == "fsdp_sp":  # after parallelize_module, on the data axis: torchtitan's order
        for block in model:
            fully_shard(block, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
    dp_rank, tp_rank = mesh["dp"].get_local_rank(), mesh["tp"].get_local_rank()
    with warnings.catch_warnings(record=True) as told:
        warnings.simplefilter("always")
        mon = hookstats.attach(model, **CFG)
        for step in range(STEPS):
            x = tp_blocks.batch(step, dp_rank)
            if mode != "tp":  # sequence parallel: each TP rank holds its part of the sequence
                part = SEQ // TP
                x = x[:, tp_rank * part:(tp_rank + 1) * part]
            tp_blocks.loss_of(model(x)).backward()
        reduced = mon.reduce(mesh=mesh, tp="tp")
        mon.remove()
    return {"stats": reduced.stats(), "replicated": reduced.replicated, "source": reduced.placement_source,
            "told": [str(w.message) for w in told]}


def worker(rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (DP, TP), mesh_dim_names=("dp", "tp"))
    res = {mode: train(mode, mesh) for mode in MODES}
    try:
        mon = hookstats.attach(tp_blocks.blocks())
        mon.reduce(mesh=mesh, tp="model")
    except ValueError as e:
        res["bad_dim"] = str(e)
    return res


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return spawn_ranks.run(worker, DP * TP, tmp_path_factory.mktemp("tp"))


@pytest.fixture(scope="module")
def expected():
    return tp_oracle.single_process(tp_blocks.blocks(), DP)


@pytest.mark.parametrize("mode", MODES)
def test_reduce_over_the_mesh_equals_one_process_measuring_the_global_batch(ranks, expected, mode):
    stats = ranks[0][mode]["stats"]
    assert set(stats) == set(expected)
    for target, x in expected.items():
        tp_oracle.assert_matches(stats[target], x, target, CFG)
    for r in ranks[1:]:  # every rank holds the same merge
        assert {k: (v["count"], v["mean"]) for k, v in r[mode]["stats"].items()} == \
               {k: (v["count"], v["mean"]) for k, v in stats.items()}


@pytest.mark.parametrize("mode", MODES)
def test_every_target_is_measured_without_a_warning(ranks, mode):
    for r in ranks:
        assert [m for m in r[mode]["told"] if "not measured" in m] == []


def test_replicated_targets_are_the_norms_and_row_parallel_outputs_without_sequence_parallelism(ranks):
    replicated = {f"{b}.{m}:{k}" for b in "01" for m in ("norm", "down") for k in ("output", "grad_output")}
    assert ranks[0]["tp"]["replicated"] == replicated
    for mode in ("sp", "fsdp_sp"):  # every value is sharded over the TP ranks
        assert ranks[0][mode]["replicated"] == set()


def test_sequence_parallel_norms_are_sharded_by_their_dtensor_placement_and_plain_outputs_by_their_states(ranks):
    norms = {f"{b}.norm:{k}" for b in "01" for k in ("output", "grad_output")}
    for mode in ("sp", "fsdp_sp"):  # SequenceParallel's outputs (and the gradients into them): DTensors, Shard(1)
        source = ranks[0][mode]["source"]
        assert {t for t, how in source.items() if how == "placement"} == norms
        assert {t for t, how in source.items() if how == "states"} == set(source) - norms
    assert set(ranks[0]["tp"]["source"].values()) == {"states"}  # every output a plain tensor


def test_a_mesh_without_the_named_dimension_is_one_clear_error(ranks):
    for r in ranks:
        assert "no dimension named 'model'" in r["bad_dim"] and "('dp', 'tp')" in r["bad_dim"]
