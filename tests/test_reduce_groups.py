"""mon.reduce(group=...) over a subgroup between reductions over every rank, on 3 gloo processes whose monitors hook
different modules: each merge equals the float64 oracle over the union of its ranks' data, and a reduction over
every rank after one over a subgroup of some ranks goes on (each group keeps the target names its ranks agreed on)."""
import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

import hookstats
from hookstats import layout
from helpers import oracle
import spawn_ranks

CFG = dict(nbins=16, lo=-2.0, hi=2.0, hist_every=1)
SUB = [1, 2]
pytestmark = pytest.mark.slow  # spawned process groups (tens of seconds): .ci/run runs them


def worker(rank, world):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))
    modules = ["0", "2"] if rank != 1 else ["2"]  # rank 1's monitor has no "0"
    mon = hookstats.attach(model, modules=modules, grads=False, **CFG)
    seen = {}
    for name in modules:
        model.get_submodule(name).register_forward_hook(
            lambda m, a, o, name=name: seen.setdefault(name, []).append(o.detach().double().reshape(-1)))
    sub = dist.new_group(SUB)  # every rank makes it; only its members reduce over it
    raw = {}

    def reduced(tag, **kw):
        raw[tag] = {k.id: (f.numpy().copy(), i.numpy().copy()) for (_, k), (f, i) in mon.reduce(**kw).states().items()}

    model(torch.randn(1 + rank, 4, generator=torch.Generator().manual_seed(rank)))
    reduced("all")
    if rank in SUB:
        reduced("sub", group=sub)
    model(torch.randn(2, 4, generator=torch.Generator().manual_seed(10 + rank)))
    reduced("all again")
    mon.remove()
    return {"seen": {k: torch.cat(v) for k, v in seen.items()}, "raw": raw}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return spawn_ranks.run(worker, 3, tmp_path_factory.mktemp("groups"))


def assert_is(state, x):
    f, i = state
    fo, io = oracle(x, hookstats.StatsConfig(**CFG))
    np.testing.assert_array_equal(i, io)
    assert f[layout.N_FINITE] == fo[layout.N_FINITE]
    assert abs(f[layout.MEAN] - fo[layout.MEAN]) <= 1e-7 * (abs(fo[layout.MEAN]) + 1)
    np.testing.assert_array_equal(f[layout.MIN:], fo[layout.MIN:])


def test_each_merge_is_its_ranks_union_and_a_reduction_over_all_follows_one_over_some(ranks):
    for tag, members in (("all", [0, 1, 2]), ("sub", SUB), ("all again", [0, 1, 2])):
        for r in members:
            got = ranks[r]["raw"][tag]
            assert set(got) == {"0:output", "2:output"}
            for name in ("0", "2"):
                # "all" is every rank's first forward; "all again" both forwards of every rank
                parts = [ranks[m]["seen"][name] for m in members if name in ranks[m]["seen"]]
                if tag != "all again":
                    parts = [p[: (1 + m) * (3 if name == "0" else 2)] for p, m in
                             zip(parts, [m for m in members if name in ranks[m]["seen"]])]
                assert_is(got[f"{name}:output"], torch.cat(parts))
