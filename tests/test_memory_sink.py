"""MemorySink's columnar storage: what it gives back is exactly what it was given (the last `max_steps`
steps; targets appearing, stopping, histograms moving across slots, NaN, histograms switched off), the long
table matches the records, and mon.memory() counts exactly the bytes of the arrays it holds."""
import copy
import gc
import math
import sys
import types

import numpy as np
import pytest
import torch
from torch import nn

import hookstats
from hookstats.sinks import SCALARS, MemorySink, Steps
from hookstats.statistics import HIST_FIGURES


class Keep:
    """A sink keeping a deep copy of every record: the oracle of what MemorySink must give back."""

    def __init__(self):
        self.steps = []

    def write(self, step, records):
        self.steps.append((step, copy.deepcopy(records)))

    def close(self):
        pass


class Drifting(nn.Module):
    """Outputs whose magnitude moves over the binades step by step; `late` joins at step 3 and stops at
    step 9; a NaN at step 5."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.late = nn.Linear(5, 7), nn.Linear(7, 2)
        self.step = 0

    def forward(self, x):
        h = self.a(x) * 10.0 ** (self.step - 6)
        if self.step == 5:
            h = h.clone()
            h[0, 0] = float("nan")
        return self.late(torch.relu(h)) if 3 <= self.step < 9 else h


def run(keep, steps=14, **config):
    model = Drifting()
    oracle, mine = Keep(), MemorySink(max_steps=keep)
    mon = hookstats.attach(model, steps="manual", history=True, log_every=3, keep=keep or 1000, sinks=[oracle, mine],
                           alerts=False, **config)
    for s in range(steps):
        model.step = s
        with torch.no_grad():
            model(torch.randn(6, 5))
        mon.step()
    mon.remove()
    return mon, oracle, mine


def assert_same_items(sink, want):
    """sink.items() hold exactly the (step, record) pairs of `want`, in order, every field equal (same())."""
    got = list(sink.items())
    assert [(s, r["target"]) for s, r in got] == [(s, r["target"]) for s, r in want]
    for (_, g), (_, w) in zip(got, want):
        assert g.keys() == w.keys()
        bad = [k for k in w if not same(g[k], w[k])]
        assert not bad, (g["target"], bad)


def same(a, b):
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return a == b and type(a) is type(b)


@pytest.mark.parametrize("config", [{}, {"linear_hist": True, "float_hist": False}, {"linear_hist": False, "float_hist": False},
                                    {"log_hist": False, "nbins": 7}])
@pytest.mark.parametrize("keep", [4, 1000, None])
def test_gives_back_exactly_the_kept_records(keep, config):
    mon, oracle, mine = run(keep, **config)
    kept = oracle.steps[-keep:] if keep else oracle.steps
    want = [(step, rec) for step, recs in kept for rec in recs]
    for sink in (mine, mon.history_sink):
        assert_same_items(sink, want)
        assert [s for s, _ in sink.steps] == [s for s, _ in kept]


@pytest.mark.parametrize("pandas", [True, False])
def test_long_table_matches_the_records(pandas, monkeypatch):
    mon, oracle, _ = run(1000)
    # a figure of the histograms that a record has not (NaN: not counted there) is no row of the table
    want = sorted((step, rec["target"], rec["kind"], "train", stat, rec[stat]) for step, recs in oracle.steps
                  for rec in recs for stat in SCALARS if rec.get(stat) is not None
                  and not (stat in HIST_FIGURES and math.isnan(rec[stat])))
    assert any(stat in HIST_FIGURES for _, _, _, _, stat, _ in want)
    if not pandas:
        monkeypatch.setitem(sys.modules, "pandas", None)
    cols = mon.history()
    assert list(cols.keys()) == ["step", "target", "kind", "phase", "stat", "value"]
    got = sorted(zip(*(list(cols[k]) for k in cols)))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g[:5] == w[:5] and same(float(g[5]), float(w[5])), (g, w)


def arrays_reachable(root):
    """Every NumPy array reachable from `root` through object references, by identity."""
    seen, found, todo = set(), {}, [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)):
            continue
        seen.add(id(obj))
        if isinstance(obj, np.ndarray):
            found[id(obj)] = obj
            continue
        todo.extend(gc.get_referents(obj))
    return found.values()


def test_memory_counts_the_bytes_of_the_host_history():
    mon, oracle, mine = run(6, steps=20)
    arrays = list(arrays_reachable(mon.history_sink))
    assert all(a.base is None for a in arrays)  # no views: their bytes are the owners'
    assert mon.memory()["host_history_bytes"] == sum(a.nbytes for a in arrays) > 0
    assert mine.nbytes() == sum(a.nbytes for a in arrays_reachable(mine))
    # columns, not a dict per record: the kept records cost a fraction of the 256-slot log2 histogram alone
    records = sum(len(recs) for _, recs in oracle.steps[-6:])
    assert mon.memory()["host_history_bytes"] < records * 256 * 8 / 2


@pytest.mark.parametrize("keep", [3, 7, None])
def test_a_flush_written_as_arrays_equals_the_same_steps_written_one_by_one(keep):
    """write_steps (History's path, a flush at a time) against write() step by step and against the plain
    list of what was written: targets appearing late and in another order, stopping, coming back after
    their rows left the window, histograms widening their span, flushes longer than `keep`."""
    rng = np.random.default_rng(keep or 0)
    steps, targets, nb = 40, 6, 5
    keys = [{"target": f"t{t}", "module": f"m{t}", "kind": "output", "leaf": "", "phase": "train"}
            for t in range(targets)]
    present = rng.random((steps, targets)) < 0.7
    present[:10, 0] = present[12:30, 1] = False  # t0 joins late, after t1..; t1 leaves and comes back
    present[:6, 4], present[6, 4], present[:3, 5], present[3, 5] = False, True, False, True  # t5 before t4
    present[5] = False  # a step where nothing was measured still counts as a write
    cols = {k: rng.integers(0, 9, (steps, targets)) for k in ("count", "finite", "near_zero_count", "nan", "posinf",
                                                               "neginf")}
    for k in ("underflow", "overflow"):  # floats: NaN on steps that counted no histograms (hist_every)
        cols[k] = rng.integers(0, 9, (steps, targets)).astype(np.float64)
        cols[k][7] = np.nan
    cols.update({k: rng.normal(size=(steps, targets)) for k in ("mean", "std", "var", "near_zero", "running_min",
                                                                 "running_max")})
    cols["mean"][3, 2] = np.nan
    cols["hist"] = rng.integers(0, 3, (steps, targets, nb)) * (rng.random((steps, targets, 1)) < 0.5)
    cols["log2_hist"] = np.zeros((steps, targets, 256), dtype=np.int64)
    cols["log2_hist"][np.arange(steps)[:, None], np.arange(targets), rng.integers(0, 256, (steps, targets))] = 4
    cols["hist_edges"] = np.linspace(-1, 1, nb + 1)
    one_by_one, by_flush = MemorySink(max_steps=keep), MemorySink(max_steps=keep)
    written = []
    for s in range(steps):
        records = [{**keys[t], **{k: v[s, t].tolist() for k, v in cols.items() if v.ndim == 2},
                    "hist": cols["hist"][s, t].copy(), "hist_edges": cols["hist_edges"].copy(),
                    "log2_hist": cols["log2_hist"][s, t].copy()} for t in np.flatnonzero(present[s])]
        one_by_one.write(100 + s, records)
        written.append((100 + s, records))
    a = 0
    for b in (1, 2, 10, 11, 19, 40):  # flushes of 1 to 21 steps
        by_flush.write_steps(Steps(list(range(100 + a, 100 + b)), keys,
                                   {k: v if k == "hist_edges" else v[a:b] for k, v in cols.items()}, present[a:b]))
        a = b
    got = list(by_flush.items())
    assert [(s, r["target"]) for s, r in got] == [(s, r["target"]) for s, r in one_by_one.items()]
    for (_, g), (_, w) in zip(got, one_by_one.items()):
        assert g.keys() == w.keys() and all(same(g[k], w[k]) for k in w), g["target"]
    for sink in (by_flush, one_by_one):  # (blocks made by one write share the edges: the byte counts may differ)
        assert sink.nbytes() == sum(a.nbytes for a in arrays_reachable(sink))
    kept = written[-keep:] if keep else written
    assert [s for s, _ in by_flush.steps] == [s for s, recs in kept if recs]
    want = sorted((s, r["target"]) for s, recs in kept for r in recs)
    assert sorted((s, r["target"]) for s, r in got) == want
    recs = {(s, r["target"]): r for s, rs in kept for r in rs}
    for s, g in got:
        w = recs[(s, g["target"])]
        assert g.keys() == w.keys() and all(same(g[k], w[k]) for k in w)
