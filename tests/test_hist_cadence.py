"""hist_every=N: the histograms (float buckets, linear bins, log2 slots) of train steps are counted on the sampled
steps k with k % (every * N) == 0 and on the ramp before the second of them, k = every * (1, 2, 4, 8, ...);
everything else on every sampled step. Checked against the test's own forward
hooks and a float64 NumPy oracle that decide independently which steps count histograms."""
import random

import numpy as np
import pytest
import torch
from helpers import float_buckets, hist_step
from torch import nn
from torch._dynamo.utils import counters
from torch.utils.checkpoint import checkpoint

import hookstats
from hookstats import config, layout

NAMES = ("0", "2")


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 5))


class Seen:
    """The test's own hooks: each hooked module's outputs as float64 NumPy arrays with the step and phase they
    came in; the step is the loop's (set by the test)."""

    def __init__(self, model, names=NAMES):
        self.step, self.values = 0, {n: [] for n in names}
        modules = dict(model.named_modules())
        self.handles = [modules[n].register_forward_hook(self.hook(n)) for n in names]

    def hook(self, name):
        def fn(module, args, out):
            self.values[name].append((self.step, "train" if module.training else "eval",
                                      out.detach().double().numpy().reshape(-1).copy()))
        return fn

    def of(self, name, steps, phase="train"):
        """One array of `name`'s values in `steps` (a set) and `phase`."""
        parts = [v for s, p, v in self.values[name] if s in steps and p == phase]
        return np.concatenate(parts) if parts else np.zeros(0)


def train(model, seen, steps, mon=None):
    """Runs `steps` train forwards on inputs(steps), telling `seen` the step; mon.step() after each when given."""
    for k, x in enumerate(inputs(steps)):
        seen.step = k
        model(x)
        if mon is not None:
            mon.step()


def hist_steps(steps, every, n, paused=()):
    """The histogram steps among range(steps): sampled (k % every == 0, not paused) and on the grid
    (k % (every * n) == 0) or the ramp below it (k = every * 2**j < every * n)."""
    return {k for k in range(steps) if k not in paused and hist_step(k, every, n)}


def sampled_steps(steps, every, paused=()):
    return {k for k in range(steps) if k % every == 0 and k not in paused}


def inputs(steps, seed=1):
    """Per step a batch; step 1's (a histogram step of the ramp) and step 5's (never a histogram step with every=1
    and hist_every > 1 here) have wide values and a NaN, step 5's the run's extremes."""
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(7, 6, generator=g) for _ in range(steps)]
    for k, scale in ((1, 20), (5, 50)):
        if k < steps:
            xs[k] = xs[k] * scale
            xs[k][0, 0] = float("nan")
    return xs


def assert_record(rec, all_values, hist_values, cfg):
    """Counts, NaN/Inf and moments over every sampled step; the histograms over the histogram steps only."""
    fin = all_values[np.isfinite(all_values)]
    assert rec["count"] == all_values.size and rec["finite"] == fin.size
    assert rec["nan"] == np.isnan(all_values).sum()
    assert rec["mean"] == pytest.approx(fin.mean(), rel=1e-6, abs=1e-9)
    assert rec["std"] == pytest.approx(fin.std(ddof=1), rel=1e-6)
    assert rec["min"] == fin.min() and rec["max"] == fin.max()
    hfin = hist_values[np.isfinite(hist_values)]
    assert rec["hist_count"] == hfin.size
    if cfg.float_hist:
        np.testing.assert_array_equal(rec["float_hist"], float_buckets(torch.from_numpy(hist_values)))
        # quantiles are of the histogram steps' values (the run's min/max lie in other steps: not used)
        for q, name in ((0.001, "p0_1"), (0.5, "p50"), (0.999, "p99_9")):
            want = np.quantile(hfin, q, method="inverted_cdf")
            assert abs(rec[name] - want) <= abs(want) / 8 + 2.0 ** -129, (name, rec[name], want)
    if cfg.linear_hist:
        h = hfin.astype(np.float32)
        t = np.floor(np.clip((h - np.float32(cfg.lo32)) * np.float32(cfg.inv_w), -1, cfg.nbins)).astype(int)
        want = np.bincount(t + 1, minlength=cfg.nbins + 2)
        np.testing.assert_array_equal(rec["hist"], want[1:-1])
        assert (rec["underflow"], rec["overflow"]) == (want[0], want[-1])


@pytest.mark.parametrize("every,n,hists", [(1, 3, dict()), (2, 2, dict(linear_hist=True, nbins=12, lo=-3, hi=3)),
                                           (1, 1, dict(linear_hist=True, float_hist=False))],
                         ids=["every1-n3", "every2-n2-linear", "n1-linear-only"])
def test_histograms_hold_exactly_the_histogram_steps(backend, every, n, hists):
    model, steps = mlp(), 9
    mon = hookstats.attach(model, every=every, hist_every=n, grads=False, **hists)
    seen = Seen(model)
    train(model, seen, steps)
    stats = mon.stats()
    hs, ss = hist_steps(steps, every, n), sampled_steps(steps, every)
    assert 0 in hs and hs != ss or n == 1
    for name in NAMES:
        assert_record(stats[f"{name}:output"], seen.of(name, ss), seen.of(name, hs), mon.cfg)
    mon.remove()


def test_pause_skips_a_histogram_step_and_keeps_the_grid():
    model, steps = mlp(), 13
    mon = hookstats.attach(model, every=2, hist_every=2, grads=False, steps="manual")
    seen = Seen(model)
    for k, x in enumerate(inputs(steps)):
        seen.step = k
        if k == 4:
            mon.pause()
        model(x)
        if k == 4:
            mon.resume()
        mon.step()
    hs = hist_steps(steps, 2, 2, paused={4})
    assert hs == {0, 2, 8, 12}
    for name in NAMES:
        assert_record(mon.stats()[f"{name}:output"], seen.of(name, sampled_steps(steps, 2, {4})), seen.of(name, hs),
                      mon.cfg)


def test_eval_forwards_in_a_step_without_histograms_keep_their_buckets():
    model = mlp()
    mon = hookstats.attach(model, hist_every=4, eval=True, grads=False, linear_hist=True)
    seen = Seen(model)
    xs = inputs(6)
    for k, x in enumerate(xs):
        seen.step = k
        model(x)
        if k in (3, 4):  # validation inside steps 3 and 4 (histograms: steps 0, 1, 2 and 4)
            model.eval()
            with torch.no_grad():
                model(xs[0] * (k + 1))
            model.train()
    train, ev = mon.stats(), mon.stats(phase="eval")
    for name in NAMES:
        assert_record(ev[f"{name}:output"], seen.of(name, {3, 4}, "eval"), seen.of(name, {3, 4}, "eval"), mon.cfg)
        assert_record(train[f"{name}:output"], seen.of(name, set(range(6))), seen.of(name, hist_steps(6, 1, 4)),
                      mon.cfg)


class Watching(nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.mon = mlp(), None

    def forward(self, x):
        return self.mon.watch("inner", self.body(x) * 2)


def test_watched_tensors_follow_the_cadence_like_outputs():
    model = Watching()
    model.mon = mon = hookstats.attach(model, hist_every=3, grads=False, modules=["body.0"])
    seen = Seen(model.body, names=("2",))
    for k, x in enumerate(inputs(7)):
        seen.step = k
        model(x)
    watched = {"2": [(s, p, v * 2) for s, p, v in seen.values["2"]]}
    seen.values = watched
    assert_record(mon.stats()["inner:watch"], seen.of("2", set(range(7))), seen.of("2", hist_steps(7, 1, 3)), mon.cfg)


def test_compiled_model_counts_the_cadence_without_recompiling():
    torch._dynamo.reset()
    counters.clear()
    model, twin = mlp(), mlp()
    mon = hookstats.attach(model, hist_every=3, grads=False, steps="manual", linear_hist=True)
    seen = Seen(twin)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    steps = 8
    for k, x in enumerate(inputs(steps)):
        seen.step = k
        compiled(x)
        twin(x)
        mon.step()
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 1  # the flag changed between 1 and 3 at steps 4, 6, 7
    for name in NAMES:
        assert_record(mon.stats()[f"{name}:output"], seen.of(name, set(range(steps))),
                      seen.of(name, hist_steps(steps, 1, 3)), mon.cfg)
    torch._dynamo.reset()


def test_reset_between_steps_restarts_the_histograms_with_the_totals():
    model = mlp()
    mon = hookstats.attach(model, hist_every=2, grads=False, steps="manual")
    seen = Seen(model)
    for k, x in enumerate(inputs(9)):
        seen.step = k
        model(x)
        mon.step()
        if k == 4:
            mon.reset()
    for name in NAMES:
        assert_record(mon.stats()[f"{name}:output"], seen.of(name, {5, 6, 7, 8}), seen.of(name, {6, 8}), mon.cfg)


class Records:
    """A sink of the test's own: every record as written."""

    def __init__(self):
        self.rows = []

    def write(self, step, records):
        self.rows += [(step, r) for r in records]

    def close(self):
        pass


@pytest.mark.parametrize("hist_every,log_every,steps,counted", [
    (5, 10, 20, {0, 1, 2, 4, 5, 10, 15}),  # the ramp (1, 2, 4): several histogram steps in the first window
    (3, 2, 6, {0, 1, 2, 3}),  # the window of steps 4-5 holds no histogram step
    (1, 10, 13, set(range(13))),  # ten histogram steps a window: its steps go to the host in copies of two
    (2, 10, 25, {0, 1} | set(range(0, 25, 2))),  # five a window, past the two growth rows a ring keeps
    (10, 20, 45, {0, 1, 2, 4, 8, 10, 20, 30, 40}),  # two a window, as many as the rows
], ids=["every-window", "a-window-without", "every-step", "more-than-the-rows", "as-many-as-the-rows"])
def test_history_buckets_are_each_histogram_steps_own(hist_every, log_every, steps, counted):
    """The record of each histogram step carries the buckets of that step's values (the test's own hook, the bucket
    oracle), however many a flush window holds; every other record carries none (None, hist_count NaN), not an
    all-zero histogram."""
    model, sink = mlp(), Records()
    mon = hookstats.attach(model, hist_every=hist_every, grads=False, steps="manual", history=True,
                           log_every=log_every, sinks=[sink], alerts=False)
    seen = Seen(model)
    train(model, seen, steps, mon)
    mon.remove()
    got = {(s, r["target"]): r for s, r in sink.rows}
    for name in NAMES:
        for k in counted:
            rec = got[(k, f"{name}:output")]
            values = seen.of(name, {k})
            np.testing.assert_array_equal(rec["float_hist"], float_buckets(torch.from_numpy(values)), err_msg=str(k))
            assert rec["hist_count"] == np.isfinite(values).sum()
        for k in set(range(steps)) - counted:
            rec = got[(k, f"{name}:output")]
            assert rec["float_hist"] is None and np.isnan(rec["hist_count"]) and np.isnan(rec["p50"])
            assert rec["count"] == seen.of(name, {k}).size


def test_history_per_step_bins_are_none_on_steps_without_histograms():
    model, sink, steps = mlp(), Records(), 7
    mon = hookstats.attach(model, hist_every=3, grads=False, steps="manual", history=True, log_every=4,
                           sinks=[sink], alerts=False, linear_hist=True, float_hist=False, nbins=8, lo=-2, hi=2)
    seen = Seen(model)
    train(model, seen, steps, mon)
    mon.remove()
    for step, rec in sink.rows:
        values = seen.of(rec["module"], {step})
        assert rec["count"] == values.size and rec["nan"] == np.isnan(values).sum()
        if step not in hist_steps(steps, 1, 3):
            assert rec["hist"] is None and rec["log2_hist"] is None and rec["hist_count"] == 0
            assert np.isnan(rec["underflow"]) and np.isnan(rec["overflow"])  # unknown there, not 0
        else:
            fin = values[np.isfinite(values)].astype(np.float32)
            t = np.floor(np.clip((fin - np.float32(-2)) * np.float32(2), -1, 8)).astype(int)
            np.testing.assert_array_equal(rec["hist"], np.bincount(t + 1, minlength=10)[1:-1])
            assert rec["hist_count"] == fin.size
            assert (rec["underflow"], rec["overflow"]) == ((fin < -2).sum(), (fin >= 2).sum())


def test_the_default_cadence_divides_log_every():
    cfg = hookstats.StatsConfig()
    assert cfg.hist_every == config.HIST_EVERY and 10 % cfg.hist_every == 0
    model = mlp()
    mon = hookstats.attach(model, grads=False)
    seen = Seen(model)
    for k, x in enumerate(inputs(config.HIST_EVERY + 2)):
        seen.step = k
        model(x)
    rec = mon.stats()["0:output"]
    hs = hist_steps(config.HIST_EVERY + 2, 1, config.HIST_EVERY)
    assert hs == {0, 1, 2, 4, 8, config.HIST_EVERY}
    np.testing.assert_array_equal(rec["float_hist"], float_buckets(torch.from_numpy(seen.of("0", hs))))


def flat(hist_steps_field):
    return [k for r in hist_steps_field["steps"] for k in r]


def test_a_run_shorter_than_one_window_is_not_described_by_step_0_alone():
    """A 10-step run with the default cadence (hist_every from the logging window): its quantiles hold steps 0, 1,
    2, 4 and 8 (the ramp), not the initial activations alone, and match the test's own float64 quantiles of exactly
    those steps' values within the float buckets' bound; stats() says which steps they are."""
    model, steps = mlp(), 10
    mon = hookstats.attach(model, grads=False, history=True, alerts=False)
    assert mon.cfg.hist_every == 10
    seen = Seen(model)
    train(model, seen, steps)
    hs = hist_steps(steps, 1, mon.cfg.hist_every)
    assert hs == {0, 1, 2, 4, 8}
    stats = mon.stats()
    for name in NAMES:
        rec = stats[f"{name}:output"]
        assert rec["hist_steps"]["count"] == len(hs) and flat(rec["hist_steps"]) == sorted(hs)
        assert (rec["hist_steps"]["first"], rec["hist_steps"]["last"]) == (0, 8)
        assert_record(rec, seen.of(name, set(range(steps))), seen.of(name, hs), mon.cfg)
    mon.remove()


@pytest.mark.parametrize("every", [1, 3])
def test_after_the_ramp_the_cadence_is_the_grid(every):
    """A long run: the ramp's steps, then exactly one histogram step in every * hist_every, every logging window
    holding one (the history's records carry the buckets of their own histogram step)."""
    model, sink, steps, log_every = mlp(), Records(), 95, 15
    mon = hookstats.attach(model, every=every, grads=False, steps="manual", history=True, log_every=log_every,
                           sinks=[sink], alerts=False)
    n = mon.cfg.hist_every
    assert every * n <= log_every
    seen = Seen(model)
    train(model, seen, steps, mon)
    hs = hist_steps(steps, every, n)
    grid = sorted(k for k in hs if k >= every * n)
    assert grid == list(range(every * n, steps, every * n))
    rec = mon.stats()["0:output"]
    assert flat(rec["hist_steps"]) == sorted(hs)
    assert_record(rec, seen.of("0", sampled_steps(steps, every)), seen.of("0", hs), mon.cfg)
    mon.remove()
    got = {s: r for s, r in sink.rows if r["target"] == "0:output"}
    # each histogram step's record has the buckets of its own values, and no other record has any
    assert {s for s, r in got.items() if r["float_hist"] is not None} == hs
    for k in hs:
        np.testing.assert_array_equal(got[k]["float_hist"], float_buckets(torch.from_numpy(seen.of("0", {k}))))


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "4", None], ids=repr)
def test_bad_hist_every_is_one_clear_error(bad):
    kwargs = {} if bad is None else {"hist_every": bad}
    if bad is None:  # None takes the default, as the other StatsConfig fields
        assert hookstats.StatsConfig(hist_every=None).hist_every == config.HIST_EVERY
        return
    with pytest.raises(ValueError, match=r"^hist_every must be an int"):
        hookstats.attach(mlp(), **kwargs)
    with pytest.raises(ValueError, match=r"^hist_every must be an int"):
        hookstats.StatsConfig(**kwargs)


def test_the_flags_tell_the_op_the_steps_mode():
    """What the device flags hold, per phase: the op reads them, so a compiled graph never needs to change."""
    model = mlp()
    mon = hookstats.attach(model, hist_every=2, every=1, steps="manual", grads=False)
    flag = {p: mon.store.flag(torch.device("cpu"), p) for p in ("train", "eval")}
    seen = []
    for _ in range(5):
        seen.append({p: int(f.item()) for p, f in flag.items()})
        mon.step()
    mon.pause()
    seen.append({p: int(f.item()) for p, f in flag.items()})
    one, skip = 1, 1 | layout.SKIP_HIST
    assert seen == [{"train": one, "eval": one}, {"train": one, "eval": one}, {"train": one, "eval": one},
                    {"train": skip, "eval": one}, {"train": one, "eval": one}, {"train": 0, "eval": 0}]


class Checkpointed(nn.Module):
    """mlp()'s shape with its first layer under activation checkpointing in training mode."""

    def __init__(self, reentrant):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.reentrant = nn.Linear(6, 16), nn.Linear(16, 5), reentrant

    def forward(self, x):
        h = checkpoint(self.a, x, use_reentrant=self.reentrant) if self.training else self.a(x)
        return self.b(torch.relu(h))


class SeenGrads:
    """The test's own gradient taps: a forward hook that hooks each output requiring grad (with reentrant
    checkpointing that is the recomputed output, in backward), the gradients as float64 with the loop's step."""

    def __init__(self, module):
        self.step, self.values = 0, []
        module.register_forward_hook(self.hook)

    def hook(self, module, args, out):
        if out.requires_grad:
            out.register_hook(self.keep)

    def keep(self, g):
        self.values.append((self.step, g.detach().double().numpy().reshape(-1).copy()))

    def of(self, steps):
        return np.concatenate([v for s, v in self.values if s in steps])


@pytest.mark.parametrize("track_eval", [False, True], ids=["eval-off", "eval-on"])
@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non-reentrant"])
def test_checkpointed_gradients_after_a_validation_forward_stay_in_the_train_step(reentrant, track_eval):
    """A forward in eval mode between a train forward and its backward (validation, a teacher pass of the same
    model) must not take the train step's gradients: with reentrant checkpointing they are tapped when the segment
    is recomputed in backward, after that eval forward."""
    model, steps = Checkpointed(reentrant), 5
    mon = hookstats.attach(model, hist_every=2, eval=track_eval, steps="manual")
    seen, grads = Seen(model, names=("a",)), SeenGrads(model.a)
    xs = inputs(steps)
    for k, x in enumerate(xs):
        seen.step = grads.step = k
        out = model(x.requires_grad_())
        model.eval()
        with torch.no_grad():
            model(xs[0] * (k + 2))
        model.train()
        seen.step = None  # the recomputed forward in backward: measured once, in the forward
        (out ** 2).sum().backward()
        mon.step()
    train, ev = mon.stats(), mon.stats(phase="eval")
    assert_record(train["a:grad_output"], grads.of(set(range(steps))), grads.of(hist_steps(steps, 1, 2)), mon.cfg)
    assert_record(train["a:output"], seen.of("a", set(range(steps))), seen.of("a", hist_steps(steps, 1, 2)), mon.cfg)
    if track_eval:
        assert sorted(ev) == ["a:output", "b:output"]  # no gradient of a train step in the eval phase
        all_eval = seen.of("a", set(range(steps)), "eval")
        assert_record(ev["a:output"], all_eval, all_eval, mon.cfg)
    else:
        assert ev == {}
    mon.remove()


@pytest.mark.parametrize("track_eval", [False, True], ids=["eval-off", "eval-on"])
def test_a_module_called_outside_the_models_forward_is_in_the_models_mode(track_eval):
    """A hooked module called directly, outside the root model's forward (model.eval(); model.encoder(x) to embed
    a validation set; model.train(); model.encoder(x) for an auxiliary loss), is in the mode the model is in
    then, not in the last root forward's: eval values neither join the train step they fall in (nor take its
    histogram cadence) nor are measured without eval=True, and train values after a validation forward are not
    lost to the eval phase."""
    model, steps = mlp(), 5
    mon = hookstats.attach(model, hist_every=2, eval=track_eval, grads=False)
    seen = Seen(model)
    xs = inputs(steps)
    for k, x in enumerate(xs):
        seen.step = k
        model.train()
        model(x)
        model.eval()
        with torch.no_grad():
            model(xs[0] * (k + 2))
            model[0](xs[0] * (k + 3))
        model.train()
        model[0](x * 2)
    train, ev = mon.stats(), mon.stats(phase="eval")
    for name in NAMES:
        assert_record(train[f"{name}:output"], seen.of(name, set(range(steps))), seen.of(name, hist_steps(steps, 1, 2)),
                      mon.cfg)
    if track_eval:
        assert sorted(ev) == [f"{name}:output" for name in NAMES]
        for name in NAMES:
            all_eval = seen.of(name, set(range(steps)), "eval")
            assert_record(ev[f"{name}:output"], all_eval, all_eval, mon.cfg)
    else:
        assert ev == {}
    mon.remove()


def test_validation_after_an_unsampled_step_is_measured():
    """every=10, 25 batches an epoch, validation after each epoch: it falls in steps 24, 49, 74, none sampled."""
    model = mlp()
    mon = hookstats.attach(model, every=10, eval=True, grads=False)
    seen = Seen(model)
    g = torch.Generator().manual_seed(3)
    for epoch in range(3):
        model.train()
        for _ in range(25):
            model(torch.randn(4, 6, generator=g))
        model.eval()
        with torch.no_grad():
            model(torch.randn(5, 6, generator=g))
    ev = mon.stats(phase="eval")
    all_eval = seen.of("0", {0}, "eval")  # Seen files every call under step 0 here
    assert ev["0:output"]["count"] == all_eval.size


def random_loop(seed, steps_mode):
    """A random mix of train steps (forward, backward, optimizer step; some with pause() or resume() between the
    forward and the backward), validation forwards, pause/resume, mon.step() and reset(), every in (1, 2, 3),
    hist_every in (1, 2, 3, 10), param_grads on. Returns the monitor and what the test's own hooks say each
    (phase, target) must hold: [(values, counted in the histograms)], since the last reset()."""
    rnd = random.Random(seed)
    every, n = rnd.choice([1, 2, 3]), rnd.choice([1, 2, 3, 10])
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = hookstats.attach(model, every=every, hist_every=n, eval=True, steps=steps_mode, param_grads=True)
    g = torch.Generator().manual_seed(seed)
    want = {}
    step, paused, started = 0, False, False
    layers = {name: model[int(name)] for name in NAMES}

    def sampled():
        return not paused and step % every == 0

    def forward(x, outs):
        handles = [m.register_forward_hook(lambda m, a, o, name=name: outs.__setitem__(name, o))
                   for name, m in layers.items()]
        out = model(x)
        for h in handles:
            h.remove()
        return out

    def add(phase, tid, t, hist):
        want.setdefault((phase, tid), []).append((t.detach().double().numpy().reshape(-1).copy(), hist))

    for _ in range(40):
        op = rnd.choice(["train", "train", "eval", "pause", "resume", "step", "step", "reset", "train+toggle"])
        if steps_mode == "forward" and op == "step":
            op = "train"
        if op.startswith("train"):
            if steps_mode == "forward":
                step, started = step + started, True
            outs, grads = {}, {}
            out = forward(torch.randn(4, 6, generator=g), outs)
            forward_sampled, hist = sampled(), step in hist_steps(step + 1, every, n)
            for name, o in outs.items():
                o.register_hook(lambda gr, name=name: grads.__setitem__(name, gr))
                if forward_sampled:
                    add("train", f"{name}:output", o, hist)
            if op == "train+toggle":
                paused = not paused
                mon.pause() if paused else mon.resume()
            (out ** 2).sum().backward()
            if sampled() and forward_sampled:  # a tap needs both: set up in the forward, the flag read in backward
                for name, gr in grads.items():
                    add("train", f"{name}:grad_output", gr, hist)
            if sampled():
                for name, p in model.named_parameters():
                    add("train", f"{name}:param_grad", p.grad, hist)
            opt.step()
            opt.zero_grad()
        elif op == "eval":
            model.eval()
            outs = {}
            with torch.no_grad():
                forward(torch.randn(3, 6, generator=g), outs)
            model.train()
            if not paused:  # eval values follow pause() only, not every=N: a validation pass is never lost
                for name, o in outs.items():
                    add("eval", f"{name}:output", o, True)
        elif op in ("pause", "resume"):
            paused = op == "pause"
            getattr(mon, op)()
        elif op == "step":
            mon.step()
            step += 1
        else:
            mon.reset()
            want.clear()
    return mon, want


@pytest.mark.parametrize("steps_mode", ["manual", "forward"])
@pytest.mark.parametrize("seed", range(8))
def test_random_loops_match_the_tests_own_hooks(seed, steps_mode):
    mon, want = random_loop(seed, steps_mode)
    for phase in ("train", "eval"):
        stats = mon.stats(phase=phase)
        for (ph, tid), parts in want.items():
            if ph != phase:
                continue
            values = np.concatenate([v for v, _ in parts])
            hist = [v for v, h in parts if h]
            hist = np.concatenate(hist) if hist else np.zeros(0)
            rec = stats[tid]
            assert rec["count"] == values.size, (phase, tid)
            assert rec["mean"] == pytest.approx(values.mean(), rel=1e-6, abs=1e-6 * values.std()), (phase, tid)
            np.testing.assert_array_equal(rec["float_hist"], float_buckets(torch.from_numpy(hist)), err_msg=tid)
        assert not [t for t, r in stats.items() if (phase, t) not in want and r["count"]], phase
    mon.remove()
