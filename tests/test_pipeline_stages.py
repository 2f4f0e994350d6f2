"""Pipeline-parallel training (torch.distributed.pipelining, GPipe, 2 micro-batches) on a 2 x 2 mesh (stages x data,
4 gloo processes): each stage's monitor measures its own layers, one step per schedule step (steps="manual"), and
mon.reduce() is one view over stages and data-parallel ranks, against one process measuring the global batch with
plain float64 hooks of its own."""
import numpy as np
import pytest
import torch

import hookstats
import spawn_ranks
import tp_blocks
import tp_oracle
from tp_blocks import STEPS

PP, DP, MICROBATCHES = 2, 2, 2
pytestmark = pytest.mark.slow  # spawned process groups (tens of seconds): .ci/run runs them


def worker(rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    mesh = init_device_mesh("cpu", (PP, DP), mesh_dim_names=("pp", "dp"))
    pp, dp = mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank()
    model = tp_blocks.stage(tp_blocks.stack(), pp)
    stage = PipelineStage(model, pp, PP, torch.device("cpu"), group=mesh["pp"].get_group())
    schedule = ScheduleGPipe(stage, MICROBATCHES, loss_fn=lambda out, target: tp_blocks.loss_of(out - target),
                             scale_grads=False)

    def run(x):
        schedule.step(x) if pp == 0 else schedule.step(target=torch.zeros_like(x))

    # the first schedule step also runs a metadata-inference forward and backward of the stage (on empty tensors
    # past the first stage), which a monitor would measure like any other: attach after it
    run(tp_blocks.batch(STEPS, dp))
    mon = hookstats.attach(model, steps="manual", hist_every=1)
    for step in range(STEPS):
        run(tp_blocks.batch(step, dp))
        mon.step()  # one step per schedule step, whatever the number of micro-batches
    reduced = mon.reduce()
    mon.remove()
    return {"stats": reduced.stats(), "hist_steps": reduced.hist_steps, "step": mon.step_count,
            "local": set(mon.stats())}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return spawn_ranks.run(worker, PP * DP, tmp_path_factory.mktemp("pp"))


def test_each_stage_measures_its_own_layers(ranks):
    for rank, r in enumerate(ranks):
        stage = rank // DP  # mesh (pp, dp): ranks 0, 1 hold stage 0
        assert r["local"] and all(t.startswith(f"layers.{stage}.") for t in r["local"]), r["local"]


def test_steps_are_the_schedule_steps_on_every_stage(ranks):
    for r in ranks:
        assert r["step"] == STEPS
        assert r["hist_steps"]["count"] == STEPS and r["hist_steps"]["last"] == STEPS - 1


def test_reduce_over_stages_and_data_ranks_equals_one_process_measuring_the_global_batch(ranks):
    expected = tp_oracle.single_process(tp_blocks.stack(), DP)
    stats = ranks[0]["stats"]
    assert set(stats) == set(expected)
    for target, x in expected.items():
        st, mean, std = stats[target], x.mean().item(), x.std().item()
        assert st["count"] == x.numel(), target
        assert abs(st["mean"] - mean) <= 1e-5 * (abs(mean) + std), target
        np.testing.assert_allclose(st["std"], std, rtol=1e-5, err_msg=target)
        np.testing.assert_allclose([st["min"], st["max"]], [x.min().item(), x.max().item()], rtol=1e-5,
                                   err_msg=target)
    for r in ranks[1:]:
        assert {k: v["count"] for k, v in r["stats"].items()} == {k: v["count"] for k, v in stats.items()}
