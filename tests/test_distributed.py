"""Monitor.reduce() across 2 and 4 gloo processes against float64 NumPy oracles over the union of the
data, and hookstats attached to DDP and FSDP2 (fully_shard) training against single-process training.
One spawn per world size runs every scenario; the tests read what each rank saved."""
import contextlib
import os
import socket
import time
from datetime import timedelta

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import hookstats
from hookstats import layout
from hookstats.distributed import Reduced, reduce
from hookstats import TargetKey
from hookstats.rawstate import combine_all
from float_oracle import float_counts
from helpers import exit_without_finalizing, float_buckets, hist_step, oracle

CFG = dict(nbins=16, lo=-2.0, hi=2.0, eps=0.05, hist_every=1)  # histograms every step (the cadence: scenario_cadence)
STEPS, BATCH, LR = 3, 4, 0.1
SPAWN_TIMEOUT_S = 240
# spawned process groups (tens of seconds): .ci/run runs them
pytestmark = pytest.mark.slow


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))


def train_batch(step, rank, world):
    g = torch.Generator().manual_seed(1000 + step * world + rank)
    return torch.randn(BATCH, 6, generator=g), torch.randn(BATCH, 3, generator=g)


def capture(model, into, names):
    """Keeps a copy of every output of the named modules (the data the oracle sees)."""
    mods = dict(model.named_modules())
    return [mods[n].register_forward_hook(lambda m, a, o, n=n: into.setdefault(n, []).append(o.detach().clone()))
            for n in names]


def raw(states):
    return {(ph, k.id): (f.cpu().numpy().copy(), i.cpu().numpy().copy()) for (ph, k), (f, i) in states.items()}


def local_raw(mon):
    return {(st.phase, k.id): (st.fstate.numpy().copy(), st.istate.numpy().copy())
            for k, _, st in mon.states(reached_only=False)}


# ---------------- what each rank runs ----------------
def scenario_reduce(rank, world):
    model = mlp()
    mon = hookstats.attach(model, modules=["0", "1", "2"], eval=True, grads=False, **CFG)
    seen = {}
    capture(model, seen, ["0", "1", "2"])
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(3 + 2 * rank, 6, generator=g) * (1 + rank)
    if rank == 1:
        x[0, 0], x[1, 2], x[2, 3] = float("nan"), float("inf"), -float("inf")
    model(x)
    model(x[:2] * 3)
    extra = None
    if rank == 0:  # an eval-phase target (lazily created ReLU state) that only rank 0 has
        model.eval()
        model(x[:2])
        model.train()
    if rank == world - 1:  # a target only the last rank has
        extra = torch.linspace(-3, 3, 7, dtype=torch.float64)
        mon.measure(TargetKey("extra", "output"), extra)
    before = local_raw(mon)
    red = mon.reduce()
    after = local_raw(mon)
    with counting_collectives() as steady:
        again = mon.reduce()
    late = None
    if rank == 0:  # a target first reached after the ranks agreed on the layout
        late = torch.linspace(-1, 5, 9, dtype=torch.float64)
        mon.measure(TargetKey("late", "output"), late)
    with counting_collectives() as regrown:
        grown = mon.reduce()
    mon.remove()
    return {"seen": seen, "extra": extra, "local": before, "local_after": after, "reduced": raw(red.states()),
            "stats": red.stats(), "eval_stats": red.stats(phase="eval"), "world": red.world_size,
            "again": raw(again.states()), "steady_calls": steady, "late": late, "grown": raw(grown.states()),
            "grown_calls": regrown}


def scenario_cadence(rank, world):
    """hist_every=2 over 4 steps: reduce() merges the ranks' histograms of steps 0, 1 (the ramp) and 2, the moments
    of all four."""
    model = mlp()
    mon = hookstats.attach(model, modules=["0", "2"], grads=False, steps="manual", hist_every=2)
    seen = {}
    capture(model, seen, ["0", "2"])
    for step in range(4):
        model(train_batch(step, rank, world)[0])
        mon.step()
    red = mon.reduce()
    mon.remove()
    return {"seen": seen, "stats": red.stats()}


@contextlib.contextmanager
def counting_collectives():
    """{collective: calls} made by hookstats.distributed inside the block."""
    import hookstats.distributed as hd
    calls = {"all_gather_object": 0, "all_reduce": 0, "all_gather": 0}
    saved = dist.all_gather_object, dist.all_reduce, hd.all_gather_single

    def counted(name, fn):
        def call(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return call
    dist.all_gather_object = counted("all_gather_object", saved[0])
    dist.all_reduce = counted("all_reduce", saved[1])
    hd.all_gather_single = counted("all_gather", saved[2])
    try:
        yield calls
    finally:
        dist.all_gather_object, dist.all_reduce, hd.all_gather_single = saved


def scenario_device_reduce(rank, world, device):
    """reduce() of a model on `device` (gloo: "cpu"; NCCL: this rank's GPU): outputs and their gradients,
    a target on the last rank only, the collectives of a first and a steady-state call."""
    model = mlp().to(device)
    mon = hookstats.attach(model, modules=["0", "2"], **CFG)
    seen = {}
    capture(model, seen, ["0", "2"])
    x = (torch.randn(3 + 2 * rank, 6, generator=torch.Generator().manual_seed(300 + rank)) * (1 + rank)).to(device)
    model(x).square().sum().backward()
    extra = None
    if rank == world - 1:
        extra = torch.linspace(-3, 3, 7 + rank, dtype=torch.float64, device=device)
        mon.measure(TargetKey("extra", "output"), extra)
    local = {(st.phase, k.id): (st.fstate.cpu().numpy().copy(), st.istate.cpu().numpy().copy())
             for k, _, st in mon.states()}
    with counting_collectives() as first:
        red = mon.reduce()
    with counting_collectives() as steady:
        again = mon.reduce()
    mon.remove()
    return {"seen": {n: [t.cpu() for t in ts] for n, ts in seen.items()}, "extra": None if extra is None else extra.cpu(),
            "local": local, "reduced": raw(red.states()), "again": raw(again.states()), "first": first,
            "steady": steady, "devices": {t.device.type for row in red.states().values() for t in row}}


def scenario_bad_config(rank, world):
    mon = hookstats.attach(mlp(), grads=False, nbins=8 + rank)
    try:
        reduce(mon)
    except ValueError as e:
        return str(e)
    finally:
        mon.remove()
    return None


class RecordingSink:
    def __init__(self):
        self.steps, self.closed = [], False

    def write(self, step, records):
        self.steps.append(step)

    def close(self):
        self.closed = True


def scenario_sinks(rank, world):
    out = {}
    for rank_zero_only in (True, False):
        model, sink = mlp(), RecordingSink()
        mon = hookstats.attach(model, grads=False, history=True, log_every=1, sinks=[sink],
                               rank_zero_only=rank_zero_only, **CFG)
        for _ in range(3):
            model(torch.randn(2, 6))
        mon.remove()
        out[rank_zero_only] = (sink.steps, sink.closed)
    return out


def scenario_history(rank, world):
    """History beside reduce(): train steps each followed by a validation forward, and a reset() before step
    3's forward (mid-step: the open step 2 keeps its record, the totals restart). The steps from 3 on, over
    all ranks, hold what reduce() merges."""
    model = mlp()
    mon = hookstats.attach(model, history=True, log_every=2, eval=True, alerts=False, **CFG)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(6):
        if step == 3:
            mon.reset()
        x, y = train_batch(step, rank, world)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        model.eval()
        with torch.no_grad():
            model(x)
        model.train()
    reduced = mon.reduce().stats()
    mon.remove()  # records the open step 5
    history = [(s, r["target"], r["count"], r["mean"], r["std"]) for s, r in mon.history_sink.items()
               if r["phase"] == "train"]
    return {"history": history, "reduced": reduced, "since": 3}


def train(model, mon_model, rank, world, **kw):
    mon = hookstats.attach(mon_model, **kw, **CFG)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = train_batch(step, rank, world)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    mon.remove()  # statistics stay readable
    return mon


def scenario_ddp(rank, world):
    ddp = nn.parallel.DistributedDataParallel(mlp())
    mon = train(ddp, ddp, rank, world, param_grads=True)
    return {"reduced": mon.reduce().stats(), "local": mon.stats()}


def scenario_fsdp2(rank, world):
    from torch.distributed.fsdp import fully_shard
    model = mlp()
    fully_shard(model[0])
    fully_shard(model[2])
    fully_shard(model)
    # each rank measures its shard of every gradient: the merge over ranks is the whole gradient
    return {"reduced": train(model, model, rank, world, param_grads=True).reduce().stats()}


def scenario_lightning(rank, world):
    """The Lightning callback under a real DDP strategy, in the process group these workers already have."""
    pytest.importorskip("lightning.pytorch")
    import lightning.pytorch as L
    from test_integration_lightning import MemoryLogger, Tiny, loader

    from hookstats.integrations.lightning import HookStatsCallback
    os.environ.update(LOCAL_RANK=str(rank), RANK=str(rank), NODE_RANK="0", WORLD_SIZE=str(world))
    model, seen = Tiny(), {"0": [], "2": []}
    for name in seen:
        model.net.get_submodule(name).register_forward_hook(
            lambda m, a, o, name=name: seen[name].append(o.detach().double().clone()) if m.training else None)
    logger = MemoryLogger()
    trainer = L.Trainer(max_epochs=1, limit_train_batches=4, limit_val_batches=0, num_sanity_val_steps=0,
                        accelerator="cpu", devices=world, strategy="ddp", logger=logger, log_every_n_steps=2,
                        callbacks=[HookStatsCallback(grads=False)], enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, loader(20 * world, 0))  # 4 batches of 5 per rank
    rows = [(s, {k: v for k, v in m.items() if k.startswith("hookstats/")}) for s, m in logger.rows]
    return {"seen": seen, "rows": [(s, m) for s, m in rows if m]}


def worker(rank, world, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    try:
        res = {name: fn(rank, world) for name, fn in [("reduce", scenario_reduce), ("bad_config", scenario_bad_config),
                                                      ("ddp", scenario_ddp), ("fsdp2", scenario_fsdp2),
                                                      ("sinks", scenario_sinks), ("history", scenario_history),
                                                      ("cadence", scenario_cadence)]}
        res["device_reduce"] = scenario_device_reduce(rank, world, "cpu")
        if world == 2:
            res["lightning"] = scenario_lightning(rank, world)
        torch.save(res, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
    exit_without_finalizing()


def nccl_worker(rank, world, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, timeout=timedelta(seconds=120),
                            device_id=torch.device("cuda", rank))
    try:
        torch.save(scenario_device_reduce(rank, world, f"cuda:{rank}"), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
    exit_without_finalizing()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_SPAWNED = {}  # world -> what each rank saved: one spawn per world size for the whole module


def run_ranks(fn, world, out, what):
    """Runs fn(rank, world, port, out) in `world` spawned processes; returns what each rank saved."""
    ctx = mp.start_processes(fn, args=(world, free_port(), str(out)), nprocs=world, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + SPAWN_TIMEOUT_S
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"{world} {what} processes did not finish within {SPAWN_TIMEOUT_S} s")
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]


def spawn(world, tmp_path_factory):
    if world not in _SPAWNED:
        _SPAWNED[world] = run_ranks(worker, world, tmp_path_factory.mktemp(f"world{world}"), "gloo")
    return _SPAWNED[world]


@pytest.fixture(scope="module", params=[2, 4], ids=lambda w: f"world{w}")
def ranks(request, tmp_path_factory):
    return spawn(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """The 2-process run, which also trains with Lightning's DDP strategy (kept out of 4 processes: slow)."""
    return spawn(2, tmp_path_factory)


# ---------------- checks ----------------
def assert_state_matches_oracle(f, i, data, cfg):
    fo, io = oracle(data, cfg)
    np.testing.assert_array_equal(i, io)  # counts, near-zero, NaN/Inf, both histograms: exact
    assert f[layout.N_FINITE] == fo[layout.N_FINITE]
    # the op's own float32 accuracy (tests/test_accumulate.py); the merge itself is checked bitwise below
    std = np.sqrt(fo[layout.M2] / fo[layout.N_FINITE])
    assert abs(f[layout.MEAN] - fo[layout.MEAN]) <= 1e-7 * (abs(fo[layout.MEAN]) + std)
    np.testing.assert_allclose(f[layout.M2], fo[layout.M2], rtol=1e-6)
    np.testing.assert_array_equal(f[layout.MIN:], fo[layout.MIN:])


def test_reduce_equals_oracle_over_union_of_ranks(ranks):
    cfg = hookstats.StatsConfig(**CFG)
    res = [r["reduce"] for r in ranks]
    reduced = res[0]["reduced"]
    expect = {("train", f"{n}:output") for n in "012"} | {("eval", f"{n}:output") for n in "012"} \
        | {("train", "extra:output")}
    assert set(reduced) == expect  # targets present on one rank only are merged too
    for phase in ("train", "eval"):
        for name in "012":
            # train: the two forwards of every rank, in rank order; eval: rank 0's third forward
            parts = [t for r in res for t in r["seen"][name][:2]] if phase == "train" else [res[0]["seen"][name][2]]
            data = torch.cat([t.reshape(-1) for t in parts])
            assert_state_matches_oracle(*reduced[(phase, f"{name}:output")], data, cfg)
            # the float buckets (on by default) summed over the ranks: those of the concatenated data
            buckets = reduced[(phase, f"{name}:output")][1][layout.float_base(cfg.nbins, cfg.flags):]
            np.testing.assert_array_equal(buckets, float_counts(data))
            assert buckets.sum() == np.isfinite(data.numpy()).sum()
    assert_state_matches_oracle(*reduced[("train", "extra:output")], res[-1]["extra"], cfg)
    assert reduced[("train", "1:output")][1][layout.nonfinite_base(cfg.nbins, cfg.flags)] > 0  # rank 1's NaN got through
    assert all(r["world"] == len(ranks) for r in res)


def test_reduce_merges_the_histogram_steps_of_every_rank(ranks):
    res = [r["cadence"] for r in ranks]
    for name in ("0", "2"):
        every = np.concatenate([t.double().numpy().ravel() for r in res for t in r["seen"][name]])
        hist = np.concatenate([r["seen"][name][k].double().numpy().ravel() for r in res for k in range(4)
                               if hist_step(k, 1, 2)])
        for r in res:
            rec = r["stats"][f"{name}:output"]
            assert rec["count"] == every.size and rec["hist_count"] == hist.size
            assert abs(rec["mean"] - every.mean()) <= 1e-7 * (abs(every.mean()) + every.std())  # the op's float32
            np.testing.assert_array_equal(rec["float_hist"], float_buckets(torch.from_numpy(hist)))


def test_history_since_a_reset_holds_what_reduce_merges(ranks):
    res = [r["history"] for r in ranks]
    for r in res:
        assert sorted({s for s, *_ in r["history"]}) == list(range(6))  # the validation forwards lost no step
    reduced = res[0]["reduced"]
    assert {t for t, rec in reduced.items() if rec["count"]} == {t for r in res for _, t, *_ in r["history"]}
    for target, rec in reduced.items():
        parts = np.array([(c, m, sd) for r in res for s, t, c, m, sd in r["history"] if t == target and s >= r["since"]])
        n, means, stds = parts[:, 0], parts[:, 1], parts[:, 2]
        mean = (n * means).sum() / n.sum()
        m2 = ((n - 1) * stds ** 2 + n * (means - mean) ** 2).sum()
        assert rec["count"] == n.sum()
        assert rec["mean"] == pytest.approx(mean, rel=1e-9, abs=1e-12)
        assert rec["std"] == pytest.approx(np.sqrt(m2 / (n.sum() - 1)), rel=1e-9)


def test_reduce_is_chan_merge_in_rank_order_on_every_rank(ranks):
    res = [r["reduce"] for r in ranks]
    for key, (f, i) in res[0]["reduced"].items():
        parts = [r["local"][key] for r in res if key in r["local"]]
        fm, im = combine_all(parts)
        np.testing.assert_array_equal(f, fm)  # bitwise: same formula, same order as the host-side merge
        np.testing.assert_array_equal(i, im)
        for r in res[1:]:
            np.testing.assert_array_equal(r["reduced"][key][0], f)
            np.testing.assert_array_equal(r["reduced"][key][1], i)


def test_reduce_keeps_the_agreed_layout_and_agrees_again_when_a_target_appears(ranks):
    cfg = hookstats.StatsConfig(**CFG)
    for r in ranks:
        res = r["reduce"]
        # steady state: one all_reduce and one all_gather, no exchange of names
        assert res["steady_calls"] == {"all_gather_object": 0, "all_reduce": 1, "all_gather": 1}
        assert res["again"].keys() == res["reduced"].keys()
        for k, (f, i) in res["reduced"].items():
            np.testing.assert_array_equal(res["again"][k][0], f)
            np.testing.assert_array_equal(res["again"][k][1], i)
        # rank 0's new target does not fit: every rank agrees on names again and repeats the two collectives
        assert res["grown_calls"] == {"all_gather_object": 1, "all_reduce": 2, "all_gather": 2}
        late = ("eval", "late:output")  # rank 0's last forward ran in eval mode
        assert res["grown"].keys() == res["reduced"].keys() | {late}
        assert_state_matches_oracle(*res["grown"][late], ranks[0]["reduce"]["late"], cfg)
        for k, (f, i) in res["reduced"].items():
            np.testing.assert_array_equal(res["grown"][k][0], f)
            np.testing.assert_array_equal(res["grown"][k][1], i)


def check_device_reduce(res, device_type):
    """Every rank holds the same merge of outputs and output gradients, equal to the float64 oracle over
    the union of the ranks' data, on the device the collectives ran on, in one all_reduce and one all_gather."""
    cfg = hookstats.StatsConfig(**CFG)
    world = len(res)
    want = {("train", f"{n}:{kind}") for n in "02" for kind in ("output", "grad_output")} | {("train", "extra:output")}
    for r in res:
        assert set(r["reduced"]) == want and r["devices"] == {device_type}
        names = 1 if world > 1 else 0  # a world of one has no names to exchange
        assert r["first"] == {"all_gather_object": names, "all_reduce": 1, "all_gather": 1}
        assert r["steady"] == {"all_gather_object": 0, "all_reduce": 1, "all_gather": 1}
        for k, (f, i) in res[0]["reduced"].items():
            for other in (r["reduced"], r["again"]):
                np.testing.assert_array_equal(other[k][0], f)
                np.testing.assert_array_equal(other[k][1], i)
    reduced = res[0]["reduced"]
    for name in "02":
        data = torch.cat([r["seen"][name][0].reshape(-1) for r in res])
        assert_state_matches_oracle(*reduced[("train", f"{name}:output")], data, cfg)
    assert_state_matches_oracle(*reduced[("train", "extra:output")], res[-1]["extra"], cfg)
    for key in want:  # gradients: the bitwise rank-order merge of what each rank measured
        fm, im = combine_all([r["local"][key] for r in res if key in r["local"]])
        np.testing.assert_array_equal(reduced[key][0], fm)
        np.testing.assert_array_equal(reduced[key][1], im)


def test_reduce_of_outputs_and_gradients_over_gloo(ranks):
    check_device_reduce([r["device_reduce"] for r in ranks], "cpu")


@pytest.mark.skipif(not (torch.cuda.is_available() and dist.is_nccl_available()), reason="NCCL needs a GPU (benchmarks/gpu_check.py runs this case on one)")
def test_reduce_of_outputs_and_gradients_over_nccl(tmp_path):
    """One rank per GPU, up to 2 (a world of one still runs NCCL's collectives on device buffers)."""
    world = min(torch.cuda.device_count(), 2)
    check_device_reduce(run_ranks(nccl_worker, world, tmp_path, "NCCL"), "cuda")


def test_reduce_leaves_local_state_and_stats_read_it(ranks):
    for r in ranks:
        res = r["reduce"]
        assert res["local"].keys() == res["local_after"].keys()
        for k, (f, i) in res["local"].items():
            np.testing.assert_array_equal(res["local_after"][k][0], f)
            np.testing.assert_array_equal(res["local_after"][k][1], i)
    stats = ranks[0]["reduce"]["stats"]
    f, i = ranks[0]["reduce"]["reduced"][("train", "2:output")]
    assert stats["2:output"]["count"] == i[layout.COUNT]
    assert stats["2:output"]["mean"] == f[layout.MEAN]
    assert set(ranks[0]["reduce"]["eval_stats"]) == {"0:output", "1:output", "2:output"}


def test_reduce_rejects_different_configs_on_every_rank(ranks):
    for r in ranks:
        assert r["bad_config"] is not None and "StatsConfig differs between ranks" in r["bad_config"]


def test_sinks_write_on_rank_zero_only_unless_asked(ranks):
    for r, res in enumerate(ranks):
        steps, closed = res["sinks"][True]
        assert closed and steps == ([0, 1, 2] if r == 0 else [])
        steps, closed = res["sinks"][False]
        assert closed and steps == [0, 1, 2]


def single_process_training(world):
    """The oracle of DDP/FSDP: one process trains on the union of the ranks' batches (equal batches: the
    same mean loss). A rank's output gradient is `world` times the single-process one (its loss is the
    mean over its own batch); its parameter gradient after DDP's all-reduce is the single-process one."""
    model = mlp()
    seen = {}
    capture(model, seen, ["0", "2"])
    def grad_tap(name):
        def hook(module, args, out):
            out.register_hook(lambda g: seen.setdefault(f"{name}:grad_output", []).append(g * world))
        return hook

    for n in ("0", "2"):
        model.get_submodule(n).register_forward_hook(grad_tap(n))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        xs, ys = zip(*(train_batch(step, r, world) for r in range(world)))
        nn.functional.mse_loss(model(torch.cat(xs)), torch.cat(ys)).backward()
        for pn, p in model.named_parameters():
            seen.setdefault(f"{pn}:param_grad", []).append(p.grad.clone())
        opt.step()
        opt.zero_grad()
    return {(n if ":" in n else f"{n}:output"): torch.cat([t.reshape(-1) for t in ts]) for n, ts in seen.items()}


def assert_close_to_oracle(st, x, cfg, copies=1):
    """Statistics of data-parallel training vs the oracle: weights after a data-parallel step differ from
    single-process ones by float32 rounding only, so values match closely and bins up to a value or two."""
    fo, io = oracle(x.repeat(copies), cfg)
    assert st["count"] == io[layout.COUNT]
    np.testing.assert_allclose(st["mean"], fo[layout.MEAN], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(st["var"], fo[layout.M2] / (fo[layout.N_FINITE] - 1), rtol=1e-5)
    np.testing.assert_allclose([st["min"], st["max"]], fo[layout.MIN:], rtol=1e-5)
    lin = io[layout.LIN_BASE: layout.LIN_BASE + layout.lin_slots(cfg.nbins)]
    assert np.abs(st["hist"] - lin[1: cfg.nbins + 1]).sum() <= 2 * copies


@pytest.mark.parametrize("mode,prefix", [("ddp", "module."), ("fsdp2", "")])
def test_data_parallel_training_matches_single_process(ranks, mode, prefix):
    cfg = hookstats.StatsConfig(**CFG)
    world = len(ranks)
    data = single_process_training(world)
    stats = ranks[0][mode]["reduced"]
    expect = {f"{n}:{k}" for n in "02" for k in ("output", "grad_output")}
    expect |= {f"{n}.{w}:param_grad" for n in "02" for w in ("weight", "bias")}
    assert set(stats) == {prefix + k for k in expect}
    for k in expect:
        # DDP: every rank measured the same synchronized gradients, copies the merge counts once (param_copies);
        # FSDP2: each rank measured its shard, so the merge is the whole gradient once
        assert_close_to_oracle(stats[prefix + k], data[k], cfg)
    for r in ranks[1:]:
        assert r[mode]["reduced"].keys() == stats.keys()
        for k in stats:
            assert r[mode]["reduced"][k]["mean"] == stats[k]["mean"] and r[mode]["reduced"][k]["count"] == stats[k]["count"]


def test_ddp_param_grad_stats_measure_the_synchronized_gradients(ranks):
    cfg = hookstats.StatsConfig(**CFG)
    data = single_process_training(len(ranks))
    for r in ranks:
        local = r["ddp"]["local"]
        for k in (f"{n}.{w}:param_grad" for n in "02" for w in ("weight", "bias")):
            assert_close_to_oracle(local["module." + k], data[k], cfg)


def test_lightning_ddp_logs_windows_merged_over_ranks_on_rank_zero(two_ranks):
    res = [r["lightning"] for r in two_ranks]
    assert all(r["rows"] == [] for r in res[1:])  # only rank 0 logs
    assert [s for s, _ in res[0]["rows"]] == [1, 3]  # the trainer's own rows (log_every_n_steps=2)
    for w, (_, metrics) in enumerate(res[0]["rows"]):
        for n in ("0", "2"):
            x = torch.cat([t.reshape(-1) for r in res for t in r["seen"][n][2 * w: 2 * w + 2]]).numpy()
            base = f"hookstats/net.{n}/output/"
            assert abs(metrics[base + "mean"] - x.mean()) <= 1e-6 * (abs(x.mean()) + x.std())
            np.testing.assert_allclose(metrics[base + "std"], x.std(ddof=1), rtol=1e-6)
            np.testing.assert_allclose([metrics[base + "min"], metrics[base + "max"]], [x.min(), x.max()], rtol=1e-6)


def test_reduce_of_a_monitor_that_saw_nothing_is_empty():
    with hookstats.attach(mlp(), **CFG) as mon:
        red = mon.reduce()
    assert red.stats() == {} and red.stats(phase="eval") == {}
    with pytest.raises(ValueError, match="phase"):
        red.stats(phase="valid")


def test_reduce_without_process_group_is_the_local_state():
    model = mlp()
    with hookstats.attach(model, param_grads=True, **CFG) as mon:
        model(torch.randn(5, 6)).sum().backward()
        mon.step()
    red = mon.reduce()
    assert isinstance(red, Reduced) and red.world_size == 1
    local, merged = mon.stats(), red.stats()
    assert local.keys() == merged.keys()
    for k in local:
        assert local[k].keys() == merged[k].keys()
        for field, v in local[k].items():
            np.testing.assert_array_equal(merged[k][field], v, err_msg=f"{k} {field}")  # NaN == NaN here
