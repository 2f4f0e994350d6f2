"""param_copies.merge(), reduce()'s rule for parameters copied on every rank, on the gathered rows of 3 made-up
ranks (no process group): a parameter alike on every rank that holds it enters once, and the summed istate is
divided by its copies; one that differs, is a piece on some rank, or is not a parameter is merged over the ranks.
The oracle is NumPy float64 over the made-up values."""
import numpy as np
import torch

import hookstats
from hookstats import layout, param_copies, rawstate
from hookstats.targets import Kind, TargetKey
from helpers import oracle

CFG = hookstats.StatsConfig(nbins=8, lo=-1.0, hi=1.0)
KEYS = [("train", TargetKey(name, kind, "", None)) for name, kind in
        (("same", Kind.PARAM), ("two", Kind.PARAM_GRAD), ("differ", Kind.PARAM), ("piece", Kind.PARAM),
         ("out", Kind.OUTPUT))]


def state(values):
    """A target's (fstate, istate), as the op keeps them (the tests' float64 oracle), or an empty one."""
    if values is None:
        return rawstate.empty(CFG.istate_size)
    f, i = oracle(torch.tensor(values, dtype=torch.float32), CFG)
    return torch.from_numpy(f), torch.from_numpy(i)


def test_copies_enter_once_and_the_rest_is_merged():
    data = {  # rank -> target -> values (None: the rank holds no state of it)
        0: {"same": [1.0, 2.0], "two": [0.5, -0.5, 3.0], "differ": [1.0], "piece": [0.0], "out": [4.0, 5.0]},
        1: {"same": [1.0, 2.0], "two": None, "differ": [2.0, 7.0], "piece": [0.0], "out": [4.0, 5.0]},
        2: {"same": [1.0, 2.0], "two": [0.5, -0.5, 3.0], "differ": [3.0], "piece": [0.0], "out": [4.0, 5.0]},
    }
    rows, summed = [], 0
    for r in range(3):
        states = [state(data[r][key.module]) for _, key in KEYS]
        f, i = torch.stack([s[0] for s in states]), torch.stack([s[1] for s in states])
        pieces = torch.tensor([key.module == "piece" and r == 1 for _, key in KEYS])
        rows.append(param_copies.packed(f, i, pieces))
        summed = summed + i
    f, copies = param_copies.merge(KEYS, torch.stack(rows), param_copies.classes(3), CFG.istate_size)
    assert copies.tolist() == [3, 2, 1, 1, 1]
    i = summed // copies[:, None]
    for k, (_, key) in enumerate(KEYS):
        held = [np.asarray(data[r][key.module], dtype=np.float64) for r in range(3) if data[r][key.module] is not None]
        x = held[0] if copies[k] > 1 else np.concatenate(held)
        assert i[k, layout.COUNT] == x.size, key.module
        assert f[k, layout.N_FINITE] == x.size, key.module
        assert abs(f[k, layout.MEAN] - x.mean()) <= 1e-6 * (1 + abs(x.mean())), key.module
        assert abs(f[k, layout.M2] - ((x - x.mean()) ** 2).sum()) <= 1e-5 * (1 + ((x - x.mean()) ** 2).sum()), key.module
        assert (f[k, layout.MIN], f[k, layout.MAX]) == (x.min(), x.max()), key.module
