"""Shards that hold equal values on every tensor-parallel rank: a column-parallel layer whose weight and bias are
zero outputs zeros on both TP ranks, states alike bit for bit, which the states alone take for one replicated
tensor. On a 2 x 2 mesh (data x tensor, 4 gloo processes), against one process measuring the global batch with
plain float64 hooks: the layer's output counted exactly when declared sharded, or when it is a DTensor whose
placement says Shard; left to its states, it is named in a warning."""
import warnings

import pytest
import torch

import hookstats
import spawn_ranks
import tp_blocks
import tp_oracle

CFG = dict(nbins=16, lo=-2.0, hi=2.0, hist_every=1)
DP, TP = 2, 2
ZEROED = "0.up:output"
NO_GRAD = "0.norm:grad_output"  # the gradient through a zero weight: replicated zeros, alike by right
pytestmark = pytest.mark.slow  # spawned process groups (tens of seconds): .ci/run runs them


def zeroed_blocks():
    model = tp_blocks.blocks()
    with torch.no_grad():
        model[0].up.weight.zero_()
        model[0].up.bias.zero_()
    return model


def parallelize(model, tp_mesh, dtensor_up):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    # use_local_output=False: the up projection returns its DTensor (Shard(-1)), the row-parallel layer takes it
    plan = {"up": ColwiseParallel(use_local_output=not dtensor_up), "down": RowwiseParallel()}
    for block in model:
        parallelize_module(block, tp_mesh, plan)
    return model


def train(mesh, dtensor_up, **declared):
    model = parallelize(zeroed_blocks(), mesh["tp"], dtensor_up)
    with warnings.catch_warnings(record=True) as told:
        warnings.simplefilter("always")
        mon = hookstats.attach(model, **CFG)
        for step in range(tp_blocks.STEPS):
            tp_blocks.loss_of(model(tp_blocks.batch(step, mesh["dp"].get_local_rank()))).backward()
        reduced = mon.reduce(mesh=mesh, tp="tp", **declared)
        mon.remove()
    return {"stats": reduced.stats(), "replicated": reduced.replicated, "source": reduced.placement_source,
            "told": [str(w.message) for w in told]}


def worker(rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (DP, TP), mesh_dim_names=("dp", "tp"))
    return {"states": train(mesh, False), "dtensor": train(mesh, True),
            "declared": train(mesh, False, sharded=["*.up:output"], replicated=[NO_GRAD])}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return spawn_ranks.run(worker, DP * TP, tmp_path_factory.mktemp("tp_zero"))


@pytest.fixture(scope="module")
def expected():
    values = tp_oracle.single_process(zeroed_blocks(), DP)
    assert torch.count_nonzero(values[ZEROED]) == 0  # what the case is about
    return values


@pytest.mark.parametrize("mode", ("declared", "dtensor"))
def test_zero_shards_declared_or_placed_as_shards_are_counted_exactly(ranks, expected, mode):
    stats = ranks[0][mode]["stats"]
    assert set(stats) == set(expected)
    for target, x in expected.items():
        tp_oracle.assert_matches(stats[target], x, target, CFG)
    assert ZEROED not in ranks[0][mode]["replicated"]
    assert ranks[0][mode]["source"][ZEROED] == {"declared": "declared", "dtensor": "placement"}[mode]
    # named: constant values that the states alone said were replicated, and only those
    doubtful = {"declared": [], "dtensor": [f"reduce: {NO_GRAD} held one constant value"]}[mode]
    for r in ranks:
        assert [m for m in r[mode]["told"] if "not measured" in m] == []
        said = [m for m in r[mode]["told"] if "constant value" in m]
        assert len(said) == len(doubtful) and all(d in m for d, m in zip(doubtful, said))


def test_the_dtensor_s_gradient_is_placed_too(ranks):
    assert ranks[0]["dtensor"]["source"]["0.up:grad_output"] == "placement"


def test_zero_shards_left_to_their_states_are_counted_once_and_named(ranks, expected):
    res = ranks[0]["states"]
    assert ZEROED in res["replicated"] and res["source"][ZEROED] == "states"
    assert res["stats"][ZEROED]["count"] * TP == expected[ZEROED].numel()  # the undercount the warning is about
    for r in ranks:
        said = [m for m in r["states"]["told"] if "constant value" in m]
        assert len(said) == 1 and f"reduce: {NO_GRAD}, {ZEROED} held one constant value" in said[0]
