"""The acceptance test: a zoo of real architectures (tests/zoo_models.py) in realistic loops (train +
validate each epoch with an EMA copy, gradient accumulation under bf16 autocast, activation checkpointing,
torch.compile), every target checked against an independent float64 oracle (tests/zoo_oracle.py): totals in
mon.stats() per phase, every sampled step exactly once in the history, MemorySink and CSVSink, and nothing
the oracle saw missing without a RuntimeWarning that names it.

Tolerances: hooked values are exact in float64 on both sides (bf16 autocast: the oracle sees the same bf16
tensors), so counts, NaN/Inf, near-zero counts, min/max and histograms must match exactly; mean and std
differ only by the kernel's summation (fp32 partial sums over chunks of <= 8 values, fp64 across chunks),
well inside rtol 1e-5 of the values' scale. Compiled runs are compared with an eager twin
of the model (the oracle's own hooks would change the compiled graph): aot_eager runs the same kernels, but
the twin's parameters drift from the compiled ones by rounding, so there moments get rtol 1e-4 and
histograms may move a few values to a neighbouring bin."""
import contextlib
import math
import re
import warnings

import numpy as np
import pytest
import torch
from torch.optim.swa_utils import AveragedModel, update_bn

import hookstats
from hookstats import statistics
from hookstats.sinks import CSVSink, MemorySink
from hookstats.sinks.csv import read_csv

from zoo_models import ARCHS, build, set_checkpointing
from zoo_oracle import Oracle

pytestmark = [pytest.mark.usefixtures("every_step_histograms"),  # their oracles count every step's histograms
              pytest.mark.slow]  # minutes of real architectures: .ci/run runs it, the README's test command does not

RTOL = 1e-5
INPUT_GRADS = {"gpt2", "bert", "t5", "llama", "vit", "lstm", "gru", "encoder", "moe"}  # no in-place op in forward
KINDS = {"output", "grad_output", "input", "param_grad"}  # what every loop measures, the oracle must see them
SCALARS = ("count", "finite", "mean", "std", "rms", "l2", "near_zero", "nan", "posinf", "neginf", "underflow", "overflow",
           "running_min", "running_max",
           # from the float buckets (float_hist): None without them; hist_count: what the histograms hold
           "hist_count", "near_zero_rel", "near_zero_rel_threshold", *(p + q for p in ("", "abs_")
                                                         for q in ("p0_1", "p1", "p50", "p99", "p99_9")))


def selected(model, include_paramless=False, exclude=()):
    """README: every module with parameters of its own (include_paramless: every module), less `exclude`."""
    return {n: m for n, m in model.named_modules()
            if (include_paramless or next(m.parameters(recurse=False), None) is not None) and n not in exclude}


@pytest.fixture(autouse=True)
def one_thread():
    """The module's cost stays one core's (tiny tensors gain nothing from threads), restored after each test."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class Loop:
    """Drives one model, its monitor (or none: an eager twin) and its oracle through optimizer steps,
    numbering steps as README says: a train-mode root forward starts a step, or mon.step() ends one."""

    def __init__(self, arch, model, mon, orc, manual=False, amp=False, ema=False, seed=1):
        self.arch, self.model, self.mon, self.orc = arch, model, mon, orc
        self.manual, self.amp = manual, amp
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        self.gen = torch.Generator().manual_seed(seed)
        self.ema = AveragedModel(model) if ema else None  # made after attach(): it deep-copies the hooks
        self.k = 0  # the optimizer steps done
        self.train_steps = []  # the step number of each optimizer step

    def autocast(self):
        return torch.autocast("cpu", dtype=torch.bfloat16) if self.amp else contextlib.nullcontext()

    def forward(self, model, batch):
        with self.autocast():
            return model(**batch)

    def train_step(self, micro=1, model=None):
        self.model.train()
        if not self.manual:
            self.orc.step = self.k
        self.train_steps.append(self.orc.step)
        for _ in range(micro):
            batch = self.arch.batch(self.gen)
            loss = self.arch.loss(self.forward(self.model if model is None else model, batch), batch) / micro
            self.orc.backward = True
            loss.backward()
            self.orc.backward = False
        self.orc.before_optimizer_step()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if self.ema is not None:
            self.ema.update_parameters(self.model)
        if self.manual:
            self.mon.step()
            self.orc.step += 1
        self.k += 1

    def validate(self, n=1):
        self.model.eval()
        with torch.no_grad():
            for _ in range(n):
                self.forward(self.model, self.arch.batch(self.gen))
            if self.ema is not None:
                self.ema.eval()
                self.forward(self.ema, self.arch.batch(self.gen))
        self.model.train()


class StepCounter:
    """The oracle's step bookkeeping without hooks, for the compiled model (its twin has the oracle)."""
    step, backward = 0, False

    def before_optimizer_step(self):
        pass


# ---- checks ----
def close(got, want, rtol, scale):
    if isinstance(want, float) and math.isnan(want):
        return isinstance(got, float) and math.isnan(got)
    return abs(got - want) <= rtol * scale


def diff(got, want, rtol, exact, history=False):
    """The differences between a hookstats record and the oracle's, as readable strings."""
    out = []
    for k in ("count", "finite", "nan", "posinf", "neginf"):
        if got[k] != want[k]:
            out.append(f"{k} {got[k]} != {want[k]}")
    if out:
        return out
    scale = abs(want["mean"]) + (want["std"] if want["finite"] > 1 else 0.0) if want["finite"] else 0.0
    for k in ("mean", "std"):
        if not close(got[k], want[k], rtol, scale or 1e-30):
            out.append(f"{k} {float(got[k])!r} != {float(want[k])!r}")
    if history:
        nz = want["near_zero_count"] / want["count"]
        if not close(got["near_zero"], nz, 1e-12, 1.0):
            out.append(f"near_zero {got['near_zero']} != {nz}")
        pairs = [("running_min", "run_min"), ("running_max", "run_max")]
    else:
        pairs = [("min", "min"), ("max", "max")]
        if got["near_zero_count"] != want["near_zero_count"] and exact:
            out.append(f"near_zero_count {got['near_zero_count']} != {want['near_zero_count']}")
    for g, w in pairs:
        if not (close(got[g], want[w], 0.0 if exact else rtol, scale or 1e-30)):
            out.append(f"{g} {float(got[g])!r} != {float(want[w])!r}")
    for k in ("underflow", "overflow"):
        if exact and got[k] != want[k]:
            out.append(f"{k} {got[k]} != {want[k]}")
    if not history and want["hist"] is not None:
        for k in ("hist", "log2_hist"):
            moved = int(np.abs(np.asarray(got[k]) - want[k]).sum())
            if moved > (0 if exact else max(2, want["count"] // 100)):
                out.append(f"{k} differs in {moved} values")
    return out


def warned_text(caught):
    return "\n".join(str(w.message) for w in caught if issubclass(w.category, RuntimeWarning))


def named(tid, text):
    """Whether a warning's text names target `tid` itself (not a longer target it begins)."""
    return re.search(re.escape(tid) + r"(?![\w\[.'@])", text) is not None


def check_stats(mon, orc, caught, phases=("train",), rtol=RTOL, exact=True, late=()):
    """Every target the oracle saw is in mon.stats(phase) with its statistics, or a RuntimeWarning names it;
    stats() lists nothing the oracle did not see. `late`: targets measured from the second sampled step."""
    stats = {phase: mon.stats(phase=phase) for phase in phases}  # first: a warning stats() gives counts too
    warned = warned_text(caught)
    problems = []
    for phase in phases:
        got = stats[phase]
        want = orc.targets(phase)
        steps = orc.steps(phase) or [0]
        for tid in sorted(want - set(got)):
            if not named(tid, warned):
                problems.append(f"[{phase}] {tid}: the oracle saw it, stats() lacks it and no warning names it")
        for tid in sorted(set(got) - want):
            problems.append(f"[{phase}] {tid}: in stats() (count {got[tid]['count']}) but never produced in this phase")
        for tid in sorted(want & set(got)):
            w = orc.expected(phase, tid, steps[1:] if tid in late else steps, mon.cfg)
            for d in diff(got[tid], w, rtol, exact):
                problems.append(f"[{phase}] {tid}: {d}")
    return problems


def check_history(mon, orc, memory, csv_path, caught, rtol=RTOL, exact=True, late=()):
    """Every sampled train step is in the history exactly once, each target of that step with that step's
    statistics (running min/max over the steps so far); the MemorySink, mon.history() and the CSV agree."""
    warned = warned_text(caught)
    problems = []
    items = list(memory.items())
    # validation passes: one record per pass and target, stamped with the step it ran in, its own counts
    evals = {(s, rec["target"]): rec for s, rec in items if rec["phase"] == "eval"}
    want_eval = orc.per_step("eval", mon.cfg) if mon.track_eval else {}
    if set(evals) != set(want_eval):
        problems.append(f"eval records {sorted(set(evals) ^ set(want_eval))[:5]} differ from the validation passes")
    for key in sorted(set(evals) & set(want_eval)):
        if evals[key]["count"] != want_eval[key]["count"]:
            problems.append(f"eval pass at step {key[0]}: {key[1]}: count {evals[key]['count']} != "
                            f"{want_eval[key]['count']}")
    items = [(s, rec) for s, rec in items if rec["phase"] == "train"]
    steps = sorted({s for s, _ in items})
    want_steps = orc.steps("train")
    if [s for s, _ in items] != sorted(s for s, _ in items):
        problems.append("the MemorySink's steps are out of order")
    if steps != want_steps:
        problems.append(f"history steps {steps} != the sampled steps that measured something {want_steps}")
    per_step = orc.per_step("train", mon.cfg)
    run = {}  # target -> (min, max) over the steps so far
    for s in want_steps:
        for tid in sorted(t for (st, t) in per_step if st == s):
            w = per_step[(s, tid)]
            if tid in late and s == want_steps[0]:
                continue  # measured from the next sampled step on: its running min/max start there
            lo, hi = run.get(tid, (math.inf, -math.inf))
            run[tid] = (min(lo, w["min"]), max(hi, w["max"])) if w["finite"] else (lo, hi)
            w["run_min"], w["run_max"] = run[tid] if w["finite"] or tid in run else (math.nan, math.nan)
    got = {}
    for s, rec in items:
        if (s, rec["target"]) in got:
            problems.append(f"step {s}: {rec['target']} recorded twice")
        got[(s, rec["target"])] = rec
    for key in sorted(set(per_step) - set(got)):
        s, tid = key
        if tid in late and s == want_steps[0]:
            continue
        if not named(tid, warned):
            problems.append(f"step {s}: {tid} missing from the history and no warning names it")
    for key in sorted(set(got) - set(per_step)):
        problems.append(f"step {key[0]}: {key[1]} in the history (count {got[key]['count']}) but not measured then")
    for key in sorted(set(got) & set(per_step)):
        for d in diff(got[key], per_step[key], rtol, exact, history=True):
            problems.append(f"step {key[0]}: {key[1]}: {d}")
    # the sinks: mon.history() and the CSV hold exactly the MemorySink's scalars (every one the sinks write, those the
    # oracle above does not check too)
    written = statistics.SCALARS
    mine = {(s, rec["target"], k): v for s, rec in items for k, v in rec.items() if k in written and v is not None}
    frame = mon.history()
    frame = frame[frame["phase"] == "train"]
    rows = list(zip(frame["step"], frame["target"], frame["stat"], frame["value"]))
    table = {(int(s), t, k): v for s, t, k, v in rows}
    if len(rows) != len(table):
        problems.append(f"mon.history() has {len(rows) - len(table)} duplicate (step, target, stat) rows")
    rows = read_csv(csv_path)[0] if csv_path.exists() else []
    from_csv = {(s, rec["target"], k): v for s, rec in rows for k, v in rec.items()
                if k in written and rec["phase"] == "train"}
    for name, other in (("mon.history()", table), ("CSVSink", from_csv)):
        if set(other) != set(mine):
            problems.append(f"{name} rows differ from the MemorySink's: {sorted(set(other) ^ set(mine))[:5]}")
        bad = [k for k in set(other) & set(mine) if not same(other[k], mine[k])]
        if bad:
            problems.append(f"{name} values differ from the MemorySink's at {sorted(bad)[:5]}")
    return problems


def same(a, b):
    return (math.isnan(a) and math.isnan(b)) if isinstance(a, float) and math.isnan(a) else float(a) == float(b)


def assert_no_problems(problems, what):
    assert not problems, f"{what}: {len(problems)} problem(s):\n" + "\n".join(problems[:60])


def monitored(arch, model, tmp_path, every, manual=False, eval=False, input_grads=False, param_grads=True,
              oracle=True):
    memory, csv_path = MemorySink(), tmp_path / "history.csv"
    kw = dict(every=every, eval=eval, inputs=True, param_grads=param_grads, input_grads=input_grads,
              steps="manual" if manual else "forward", history=True, log_every=2, sinks=[memory, CSVSink(csv_path)],
              alerts=False, **arch.attach)
    # the oracle checks the kernel's per-step linear bins and log2 slots (the float buckets: test_float_hist.py,
    # test_history.py)
    kw.update(linear_hist=True, float_hist=False)
    mon = hookstats.attach(model, **kw)
    orc = None
    if oracle:
        mods = selected(model, **arch.attach)
        orc = Oracle(model, mods, every=every, eval=eval, inputs=True, param_grads=True,
                     input_grads=set(mods) if input_grads else ())
    return mon, orc, memory, csv_path


ZOO = sorted(ARCHS)


# ---- the loops ----
@pytest.mark.parametrize("eval", [False, True], ids=["eval_unmeasured", "eval_measured"])
@pytest.mark.parametrize("name", ZOO)
def test_train_and_validate_each_epoch(name, eval, tmp_path):
    """Two epochs of three steps, every=2: a validation forward between train steps and a validation at
    each epoch's end (measured apart with eval=True, not at all without); inputs, parameter gradients and
    (where the model allows) input gradients."""
    arch = ARCHS[name]
    model = build(arch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mon, orc, memory, csv_path = monitored(arch, model, tmp_path, every=2, eval=eval,
                                               input_grads=name in INPUT_GRADS)
        loop = Loop(arch, model, mon, orc)
        for epoch in range(2):
            for i in range(3):
                loop.train_step()
                if i == 1:
                    loop.validate(1)
            loop.validate(2)
        mon.remove()
        assert loop.train_steps == list(range(6)) and orc.steps("train") == [0, 2, 4]
        assert orc.kinds() == KINDS | ({"grad_input"} if name in INPUT_GRADS else set())
        assert_no_problems(check_stats(mon, orc, caught, phases=("train", "eval"))
                           + check_history(mon, orc, memory, csv_path, caught), name)


@pytest.mark.parametrize("name", ZOO)
def test_an_ema_copy_feeds_nothing_into_the_monitor(name, tmp_path):
    """torch.optim.swa_utils.AveragedModel deep-copies the model after attach() (hooks included), is
    updated each step and validated, and its BatchNorm statistics are refreshed by train-mode forwards
    (update_bn): none of the copy's forwards is the monitored model's, in either phase."""
    arch = ARCHS[name]
    model = build(arch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mon, orc, memory, csv_path = monitored(arch, model, tmp_path, every=1, eval=True)
        loop = Loop(arch, model, mon, orc, ema=True)
        for i in range(3):
            loop.train_step()
            if i == 1:  # mid-run, while the monitored model is in its train phase
                update_bn([arch.batch(loop.gen) for _ in range(2)], ForwardKwargs(loop.ema))
            loop.validate(1)
        update_bn([arch.batch(loop.gen) for _ in range(2)], ForwardKwargs(loop.ema))
        mon.remove()
        assert orc.steps("train") == [0, 1, 2] and orc.kinds() == KINDS
        assert_no_problems(check_stats(mon, orc, caught, phases=("train", "eval"))
                           + check_history(mon, orc, memory, csv_path, caught), name)


class ForwardKwargs(torch.nn.Module):
    """update_bn calls model(batch): this calls the EMA copy with the batch's keyword arguments."""

    def __init__(self, ema):
        super().__init__()
        self.ema = ema

    def forward(self, batch):
        return self.ema(**batch)


@pytest.mark.parametrize("name", ZOO)
def test_gradient_accumulation_under_bf16_autocast(name, tmp_path):
    """steps="manual": two micro-batches per optimizer step under CPU bf16 autocast, mon.step() after each
    optimizer step, a validation forward between steps (it belongs to the next step)."""
    arch = ARCHS[name]
    model = build(arch)
    if not torch_runs_under_bf16_autocast(arch):
        pytest.skip(f"torch itself cannot run {name} under CPU bf16 autocast on this CPU (oneDNN has no primitive "
                    "for it without AVX-512), hooks or not")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mon, orc, memory, csv_path = monitored(arch, model, tmp_path, every=1, manual=True)
        loop = Loop(arch, model, mon, orc, manual=True, amp=True)
        for i in range(4):
            loop.train_step(micro=2)
            if i == 1:
                loop.validate(1)
        mon.remove()
        assert orc.steps("train") == [0, 1, 2, 3] and orc.kinds() == KINDS
        assert_no_problems(check_stats(mon, orc, caught) + check_history(mon, orc, memory, csv_path, caught), name)


def torch_runs_under_bf16_autocast(arch):
    """Whether a fresh copy of the architecture, without hooks, runs a training forward under CPU bf16 autocast:
    torch's LSTM needs oneDNN's bf16 RNN primitive, which CPUs without AVX-512 lack."""
    model = build(arch)
    loop = Loop(arch, model, None, None, amp=True)
    try:
        loop.forward(model, arch.batch(loop.gen))
    except RuntimeError as e:
        if "primitive descriptor" in str(e):
            return False
        raise
    return True


@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
@pytest.mark.parametrize("name", ZOO)
def test_activation_checkpointing(name, reentrant, tmp_path):
    """Checkpointed blocks (HF: activation_checkpointing_enable(); others: torch.utils.checkpoint): the
    recomputed forward is not counted again, gradients through it are measured once. (No validation
    here: test_train_and_validate_each_epoch covers it, and this test is about checkpointing alone.)"""
    arch = ARCHS[name]
    model = build(arch)
    set_checkpointing(arch, model, reentrant)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mon, orc, memory, csv_path = monitored(arch, model, tmp_path, every=1)
        loop = Loop(arch, model, mon, orc)
        for i in range(3):
            loop.train_step()
        mon.remove()
        assert orc.steps("train") == [0, 1, 2] and orc.kinds() == KINDS
        assert_no_problems(check_stats(mon, orc, caught) + check_history(mon, orc, memory, csv_path, caught), name)



# (model, what ends a step, whether one eager step runs first, param_grads): every combination on the CNN;
# a transformer whose tuple outputs and parameterless modules are first reached inside compiled code, with
# nothing but its optimizer steps to end steps (no mon.step(), no parameter-gradient hook); GPT-2. Compiling
# is the slow part of this module, hence not the full product.
COMPILE_CASES = [("cnn", ends, first, True) for ends in ("optimizer", "mon.step") for first in (True, False)] + [
    ("encoder", "optimizer", False, False), ("gpt2", "mon.step", True, True)]


@pytest.mark.parametrize("name,ends,eager_first,param_grads", COMPILE_CASES,
                         ids=[f"{n}-{e}-{'eager_step_first' if f else 'compiled_from_step_0'}"
                              + ("" if p else "-no_param_grads") for n, e, f, p in COMPILE_CASES])
def test_torch_compile_with_an_optimizer_loop(name, ends, eager_first, param_grads, tmp_path, fresh_dynamo):
    """attach, then torch.compile (aot_eager), every=2: steps end at each optimizer step or at mon.step().
    The oracle watches an eager twin fed the same batches. With one eager step first every target is
    measured from step 0; without it, targets first reached inside compiled code are measured from the
    next call on, and a RuntimeWarning names them."""
    arch = ARCHS[name]
    model, twin = build(arch, dropout=0.0), build(arch, dropout=0.0)
    manual = ends == "mon.step"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mon, _, memory, csv_path = monitored(arch, model, tmp_path, every=2, manual=manual, oracle=False,
                                             param_grads=param_grads)
        orc = Oracle(twin, selected(twin, **arch.attach), every=2, inputs=True, param_grads=param_grads)
        compiled = torch.compile(model, backend="aot_eager")
        loop = Loop(arch, model, mon, StepCounter(), manual=manual)
        ref = Loop(arch, twin, None, orc)
        for k in range(5):
            loop.train_step(model=model if eager_first and k == 0 else compiled)
            ref.train_step()
        mon.remove()
        assert orc.steps("train") == [0, 2, 4] and orc.kinds() == KINDS - (set() if param_grads else {"param_grad"})
        late = set()
        if not eager_first:
            mon.stats()  # an eager point too: the warning about late targets may come from it
            text = warned_text(caught)
            late = {t for t in orc.targets("train") if named(t, text)}
        assert_no_problems(check_stats(mon, orc, caught, rtol=1e-4, exact=False, late=late)
                           + check_history(mon, orc, memory, csv_path, caught, rtol=1e-4, exact=False, late=late), name)
