"""Monitor checkpoints of a run over several ranks: each rank's totals are its own. Through
torch.distributed.checkpoint (which keeps one copy of a key that every rank saves) each rank gets its own totals
back, and a rank refuses another rank's state dict, or one of a run of another size, instead of counting one rank's
values twice in reduce(). Checked against each rank's own float64 record of the values it measured."""
import functools

import pytest
import torch
from torch import nn

import hookstats
import spawn_ranks

TARGET = "0:output"


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 3), nn.ReLU(), nn.Linear(3, 2))


def train(mon_model, rank, steps):
    """Forwards of 2 + 3 * rank rows: ranks hold different counts. The values of layer 0's outputs, in float64."""
    seen = []
    hook = mon_model[0].register_forward_hook(lambda m, a, o: seen.append(o.detach().double().reshape(-1)))
    for step in range(steps):
        x = torch.randn(2 + 3 * rank, 5, generator=torch.Generator().manual_seed(10 * rank + step))
        mon_model(x).sum().backward()
    hook.remove()
    return torch.cat(seen)


def worker(folder, rank, world):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    net = model()
    mon = hookstats.attach(net)
    seen = train(net, rank, steps=2)
    sd = mon.state_dict()
    dcp.save({"mon": sd}, checkpoint_id=f"{folder}/dcp")
    if rank == 0:
        torch.save(sd, f"{folder}/rank0_only.pt")
    mon.remove()

    again = model()
    resumed = hookstats.attach(again)
    train(again, rank, steps=2)  # torch.distributed.checkpoint loads into a state dict of the same targets
    into = {"mon": resumed.state_dict()}
    dcp.load(into, checkpoint_id=f"{folder}/dcp")
    resumed.load_state_dict(into["mon"])
    stats, merged = resumed.stats(), resumed.reduce().stats()
    dist.barrier()
    try:  # every rank loading the one file rank 0 saved
        hookstats.attach(model()).load_state_dict(torch.load(f"{folder}/rank0_only.pt", weights_only=True))
        refused = None
    except ValueError as e:
        refused = str(e)
    return {"seen": seen, "count": stats[TARGET]["count"], "mean": stats[TARGET]["mean"],
            "merged": merged[TARGET]["count"], "refused": refused, "sd": sd}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ckpt")
    return spawn_ranks.run(functools.partial(worker, str(folder)), 2, folder)


@pytest.mark.slow  # spawned process groups (tens of seconds): .ci/run runs them
def test_each_rank_resumes_its_own_totals_through_distributed_checkpoint(ranks):
    for r in ranks:
        x = r["seen"].numpy()
        assert r["count"] == x.size
        assert abs(r["mean"] - x.mean()) <= 1e-6 * (abs(x.mean()) + x.std())
        assert r["merged"] == sum(o["seen"].numel() for o in ranks)


@pytest.mark.slow
def test_a_rank_refuses_the_state_dict_of_another_rank_or_world(ranks):
    assert ranks[0]["refused"] is None
    assert "no totals of rank 1" in ranks[1]["refused"]
    with pytest.raises(ValueError, match="a run of 2 rank"):  # this process is a world of one
        hookstats.attach(model()).load_state_dict(ranks[1]["sd"])


def test_a_state_dict_names_its_rank_and_world(monkeypatch):
    import hookstats.ranks as ranks
    monkeypatch.setattr(ranks, "is_initialized", lambda: True)
    monkeypatch.setattr(ranks, "world_size", lambda group=None: 3)
    monkeypatch.setattr(ranks, "rank", lambda group=None: 2)
    net = model()
    with hookstats.attach(net) as mon:
        seen = train(net, 0, steps=1)
        sd = mon.state_dict()
    assert sd["world_size"] == 3 and list(sd["states"]) == ["rank2"]
    with hookstats.attach(net) as mon:
        mon.load_state_dict(sd)
        assert mon.stats()[TARGET]["count"] == seen.numel()
    monkeypatch.setattr(ranks, "rank", lambda group=None: 1)
    with hookstats.attach(net) as mon, pytest.raises(ValueError, match=r"no totals of rank 1 \(it holds \['rank2'\]\)"):
        mon.load_state_dict(sd)
    monkeypatch.setattr(ranks, "world_size", lambda group=None: 1)
    with hookstats.attach(net) as mon, pytest.raises(ValueError, match="a run of 3 rank"):
        mon.load_state_dict(sd)
