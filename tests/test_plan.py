"""plan(): its targets, values and memory against a real attach() on the same model, its detach figures
against a real detach-to-CPU hook, its time figures against hand computations, and the CLI presets."""
import json
import math
import warnings

import pytest
import torch
from torch import nn

import hookstats
from hookstats.tools import cli, op_speed
from hookstats.tools import planner as plan_cli
from hookstats.tools.planner import default_loss, plan

pytestmark = pytest.mark.usefixtures("every_step_histograms")  # their oracles count every step's histograms



class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.Conv2d(8, 8, 3, stride=2, padding=1, bias=False), nn.ReLU())
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        return self.head(self.body(x).mean((2, 3)))


class LSTMNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.lstm, self.head = nn.Embedding(20, 6), nn.LSTM(6, 7, batch_first=True), nn.Linear(7, 3)

    def forward(self, idx):
        out, (h, c) = self.lstm(self.emb(idx))
        return self.head(out[:, -1]) + h[-1].sum() + c.sum()


class Shared(nn.Module):
    """One Linear called twice per forward (separate_calls), then a frozen one."""

    def __init__(self):
        super().__init__()
        self.fc, self.frozen = nn.Linear(4, 4), nn.Linear(4, 2)
        self.frozen.requires_grad_(False)

    def forward(self, x):
        return self.frozen(torch.tanh(self.fc(torch.relu(self.fc(x)))))


def gpt2_tiny():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=40, n_positions=12)
    model = GPT2LMHeadModel(cfg)
    ids = torch.randint(0, 40, (2, 8))
    return model, (ids,), {"labels": ids, "use_cache": False}


def model_and_inputs(name):
    torch.manual_seed(0)
    if name == "cnn":
        return CNN(), (torch.randn(2, 3, 8, 8),), {}
    if name == "lstm":
        return LSTMNet(), (torch.randint(0, 20, (3, 5)),), {}
    if name == "shared":
        return Shared(), (torch.randn(3, 4, requires_grad=True),), {}
    return gpt2_tiny()


def real_step(model, args, kwargs, **attach_kwargs):
    """One real training step with attach(): the oracle plan() must match."""
    mon = hookstats.attach(model, **attach_kwargs)
    loss = default_loss(model(*args, **kwargs))
    loss.backward()
    mon.step()
    stats, memory = mon.stats(), mon.memory()
    mon.remove()
    return stats, memory


VARIANTS = [
    {},
    {"outputs": True, "grads": False},
    {"inputs": True, "grads": False},
    {"input_grads": True},
    {"param_grads": True, "grads": False, "outputs": False},
    {"inputs": True, "input_grads": True, "param_grads": True, "separate_calls": True},
    {"include_paramless": True, "separate_calls": True},
    {"types": [nn.Linear], "param_grads": True},
]


@pytest.mark.parametrize("name", ["cnn", "lstm", "shared", "gpt2"])
@pytest.mark.parametrize("kwargs", VARIANTS, ids=lambda k: ",".join(k) or "default")
def test_targets_and_values_equal_a_real_attach(name, kwargs):
    if name == "gpt2":
        pytest.importorskip("transformers")
    model, args, kw = model_and_inputs(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # attach()'s own notes (input_grads skips, PyTorch's first-layer note)
        stats, _ = real_step(model, args, kw, **kwargs)
        p = plan(model, *args, example_kwargs=kw, speed=False, **kwargs)
    assert [t.id for t in p.targets] and sorted(t.id for t in p.targets) == sorted(stats)
    assert {t.id: t.values for t in p.targets} == {k: r["count"] for k, r in stats.items()}


@pytest.mark.parametrize("kwargs", [{}, {"history": True}, {"history": 3, "param_grads": True, "nbins": 64}])
def test_memory_equals_mon_memory(kwargs):
    model, args, kw = model_and_inputs("cnn")
    _, memory = real_step(model, args, kw, **kwargs)
    planned = plan(model, *args, speed=False, **kwargs).memory
    host_history = ("host_history_bytes", "host_history_max_bytes")  # predicted at `keep` steps: the test below
    assert {k: v for k, v in planned.items() if k not in host_history} == \
        {k: v for k, v in memory.items() if k not in host_history}


@pytest.mark.parametrize("kwargs", [{"linear_hist": False, "log_hist": False, "float_hist": False},
                                    {"linear_hist": True, "float_hist": False},
                                    {"nbins": 8, "param_grads": True, "log_hist": False, "float_hist": False},
                                    {"every": 2, "linear_hist": True, "float_hist": False}, {}, {"every": 2}])
def test_host_history_at_keep_steps_against_a_real_run(kwargs):
    """Once mon.history() keeps `keep` steps the host holds per target and step the step, 8 int64 and 8
    float64 scalars (7 ints without the linear histogram, moments_overflow among them; 36 more floats with the float buckets: near_zero_rel,
    its threshold, 2 x 5 quantiles, 24 low-precision what-if shares; one more, hist_count, with any histogram), slot 0 of each dense histogram, and the span of slots the records used;
    the float buckets only on a flush's last step, as (int16 slot, int64 count) pairs: the planned fixed
    part is exact, the spans at most the whole histograms, the buckets at most every slot on every step."""
    torch.manual_seed(0)
    model, x, keep = nn.Sequential(nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 6)), torch.randn(4, 6), 12
    p = plan(model, x, speed=False, history=True, log_every=5, keep=keep, **kwargs)
    mon = hookstats.attach(model, history=True, log_every=5, keep=keep, **kwargs)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    for _ in range(keep * kwargs.get("every", 1)):
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
    mon.flush()
    real = mon.memory()["host_history_bytes"]
    mon.remove()
    linear, log2 = kwargs.get("linear_hist", "nbins" in kwargs), kwargs.get("log_hist", True)
    buckets = kwargs.get("float_hist", True)
    nbins, targets = kwargs.get("nbins", 40), 4 + 4 * bool(kwargs.get("param_grads"))
    hists = bool(buckets or linear or log2)  # hist_count, a float
    # 2: rms and l2
    fixed = targets * keep * 8 * (1 + 7 + 2 + 2 * linear + 6 + 36 * buckets + hists + linear + log2) + linear * 8 * (nbins + 1)
    widest = fixed + targets * keep * 8 * (linear * (nbins - 1) + log2 * 255) + linear * (targets - 1) * 8 * (nbins + 1) \
        + buckets * targets * keep * 10 * 4096
    assert len(p.targets) == targets
    assert p.memory["host_history_bytes"] == fixed and p.memory["host_history_max_bytes"] == widest
    assert fixed <= real <= widest
    if linear or log2:
        assert real > fixed  # the spans the records used
    else:
        assert real == fixed
    line = next(ln for ln in p.table().splitlines() if ln.startswith(f"mon.history() on the host after {keep} "))
    assert plan_cli.size_text(fixed) in line


def test_detach_bytes_equal_what_a_detach_to_cpu_hook_copies():
    """The bytes a hand-written detach-to-CPU hook keeps for every output and output gradient of the hooked
    modules (fastai's Hook(cpu=True)), counted by the test's own hooks."""
    model, args, kw = model_and_inputs("lstm")
    kept = []

    def keep(t):
        kept.append(t.detach().cpu())

    def hook(m, a, out):
        for leaf in hookstats.tensors.tensor_leaves(out):
            t = leaf[1]
            if t.is_floating_point():
                keep(t)
                if t.requires_grad:
                    t.register_hook(keep)
    handles = [m.register_forward_hook(hook) for m in model.modules() if next(m.parameters(False), None) is not None]
    default_loss(model(*args)).backward()
    for h in handles:
        h.remove()
    copied = sum(t.numel() * t.element_size() for t in kept)
    p = plan(model, *args, speed=False)
    assert p.bytes == copied and p.detach_held(7) == 7 * copied
    assert sum(t.values for t in p.targets) == sum(t.numel() for t in kept)


def test_a_meta_model_plans_like_the_real_one_and_is_left_alone():
    real, args, kw = model_and_inputs("cnn")
    with torch.device("meta"):
        meta = CNN()
    params = list(meta.parameters())
    a = plan(real, *args, speed=False, param_grads=True)
    b = plan(meta, torch.empty(2, 3, 8, 8, device="meta"), speed=False, param_grads=True)
    assert [(t.id, t.shapes, t.dtype, t.bytes) for t in a.targets] == [(t.id, t.shapes, t.dtype, t.bytes) for t in b.targets]
    assert a.memory == b.memory
    assert list(meta.parameters()) == params and all(p.grad is None and p.is_meta for p in params)
    assert all(p.grad is None for p in real.parameters())
    assert hookstats.monitor.attached_monitor(real) is None and not real.head._forward_hooks


def test_bf16_model_and_shapes_per_call():
    model, args, kw = model_and_inputs("shared")
    model = model.to(torch.bfloat16)
    p = plan(model, args[0].to(torch.bfloat16), speed=False)
    fc = next(t for t in p.targets if t.id == "fc:output")
    assert fc.shapes == [(3, 4), (3, 4)] and fc.dtype == "bfloat16" and fc.bytes == 2 * 12 * 2


class PerValue:
    """A speed model of the test's own: 1 us per call plus 1 ns per value."""
    source = "test"

    def seconds(self, dtype, numel):
        return 1e-6 + 1e-9 * numel


def test_prediction_from_step_time_and_from_flops():
    model, args, kw = model_and_inputs("cnn")
    stats, _ = real_step(model, args, kw)
    p = plan(model, *args, speed=PerValue(), every=2)
    calls = len(stats)  # one call per target in this model
    op = calls * 1e-6 + sum(r["count"] for r in stats.values()) * 1e-9
    assert math.isclose(p.op_seconds, op)
    pr = p.predict(step_time=op * 10, budget=0.05)
    assert math.isclose(pr["overhead_every_1"], 0.1) and math.isclose(pr["overhead"], 0.05)
    assert pr["every_for_budget"] == 2
    assert p.predict(step_time=op * 100, budget=0.05)["every_for_budget"] == 1
    # FLOPs of one step: the test's own count of the convolutions and the linear head, forward and backward
    flops_fwd = 2 * (2 * 8 * 8 * 8 * 3 * 9) + 2 * (2 * 4 * 4 * 8 * 8 * 9) + 2 * (2 * 8 * 5)
    assert p.flops >= 2 * flops_fwd  # backward at least as much again
    assert math.isclose(p.predict(peak_flops=p.flops / (op * 10))["overhead_every_1"], 0.1)


def test_h100_table_at_a_measured_point_and_cpu_fit_runs():
    s = op_speed.H100Speed()
    assert math.isclose(s.seconds(torch.float32, 64 * op_speed.MB // 4), 64 * op_speed.MB / 1328e9)
    assert math.isclose(s.seconds(torch.bfloat16, 256 * op_speed.MB // 2), 256 * op_speed.MB / 1055e9)
    assert s.seconds(torch.float32, 1) == pytest.approx(op_speed.H100_EAGER_CALL_S, rel=1e-3)
    cpu = op_speed.MeasuredSpeed(hookstats.StatsConfig(), sizes=(16, 1024), repeats=1, pool=1 << 12)
    (t16, t1024) = cpu.measure(torch.float32)
    assert cpu.seconds(torch.float32, 16) == t16 and cpu.seconds(torch.float32, 1) == t16
    assert math.isclose(cpu.seconds(torch.float32, 520), (t16 + t1024) / 2)
    assert math.isclose(cpu.seconds(torch.float32, 4096), 4 * t1024)


def test_plan_leaves_the_op_and_other_monitors_working():
    model, args, kw = model_and_inputs("cnn")
    other = nn.Linear(3, 3)
    mon = hookstats.attach(other)
    plan(model, *args, speed=False)
    other(torch.ones(2, 3))
    assert mon.stats()["Linear:output"]["count"] == 6
    assert hookstats.accumulate.accumulate_ is hookstats.accumulate.COMPILED_OP or hookstats.backend() == "reference"
    mon.remove()


def test_plans_in_two_threads_each_see_their_own_calls():
    import threading
    model, args, kw = model_and_inputs("lstm")
    alone = [(t.id, t.values) for t in plan(model, *args, speed=False, param_grads=True).targets]
    got = []
    threads = [threading.Thread(target=lambda: got.append(
        [(t.id, t.values) for t in plan(model, *args, speed=False, param_grads=True).targets])) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [alone, alone]


def mixtral_tiny(dtype):
    """A mixture of experts from transformers (no download): its experts run aten._grouped_mm."""
    from transformers import MixtralConfig, MixtralForCausalLM
    torch.manual_seed(0)
    cfg = MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                        max_position_embeddings=16)
    ids = torch.randint(0, 64, (2, 8))
    return MixtralForCausalLM(cfg).to(dtype), (ids,), {"labels": ids}


def test_a_mixture_of_experts_plans_like_a_real_attach():
    """bfloat16: the targets and values of a real step. float32: where the fake kernel of an op refuses what the real
    op runs (aten._grouped_mm's takes only bfloat16 in some torch versions), one error naming the op and the way out;
    where it does not, the real step's targets."""
    pytest.importorskip("transformers")
    for dtype in (torch.bfloat16, torch.float32):
        model, args, kw = mixtral_tiny(dtype)
        stats, _ = real_step(model, args, kw, param_grads=True)
        try:
            p = plan(model, *args, example_kwargs=kw, speed=False, param_grads=True)
        except ValueError as e:
            assert dtype == torch.float32 and "_grouped_mm" in str(e) and "model.to(torch.bfloat16)" in str(e), e
            continue
        assert any("experts" in t.id for t in p.targets)
        assert {t.id: t.values for t in p.targets} == {k: r["count"] for k, r in stats.items()}


def test_an_op_whose_fake_kernel_refuses_is_named():
    """A custom op whose fake kernel refuses float32 while the real one runs it: plan() names the op; a model error
    that is not an op's (raised in Python) is the model's own and goes through unchanged."""
    @torch.library.custom_op("hookstats_test::bf16_only", mutates_args=())
    def bf16_only(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @bf16_only.register_fake
    def _(x):
        torch._check(x.dtype == torch.bfloat16, lambda: "bf16_only: expected bfloat16")
        return torch.empty_like(x)

    class UsesIt(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return bf16_only(self.fc(x))

    model = UsesIt()
    assert model(torch.ones(2, 4)).shape == (2, 4)  # the real op runs float32
    with pytest.raises(ValueError, match=r"hookstats_test.bf16_only.*refused.*expected bfloat16") as e:
        plan(model, torch.ones(2, 4), speed=False)
    assert isinstance(e.value, RuntimeError)  # what the op raised, for code that catches that

    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            raise RuntimeError("the model's own error")
    with pytest.raises(RuntimeError, match="the model's own error"):
        plan(Broken(), torch.ones(2, 4), speed=False)


def test_plan_is_exported():
    assert hookstats.plan is plan and plan_cli.plan is plan


def test_bad_input():
    with pytest.raises(ValueError, match="nn.Module"):
        plan(lambda x: x, torch.ones(1))

    class ReadsValues(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2, 2)

        def forward(self, x):
            return self.fc(x) if bool(x.sum() > 0) else -self.fc(x)
    with pytest.raises(ValueError, match="reads tensor values"):
        plan(ReadsValues(), torch.ones(1, 2), speed=False)
    model = CNN()
    with hookstats.attach(model):
        with pytest.raises(ValueError, match="before attach"):
            plan(model, torch.ones(1, 3, 4, 4), speed=False)
    assert plan(model, torch.ones(1, 3, 4, 4), speed=False).targets  # removed: fine
    p = plan(model, torch.ones(1, 3, 4, 4), speed=False)
    for bad in ({"step_time": 0}, {"step_time": -1.0}, {"budget": 0}, {"peak_flops": float("inf")}):
        with pytest.raises(ValueError, match="positive number"):
            p.predict(**bad)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="speed='cuda'"):
            plan(CNN(), torch.ones(1, 3, 4, 4), device="cuda")


# ---------------------------------------------------------------- CLI
def test_cli_gpt2_table_and_json(capsys):
    pytest.importorskip("transformers")
    assert plan_cli.main(["gpt2", "--seq", "16", "--step-time", "0.1"]) == 0
    out = capsys.readouterr().out
    assert "transformer.h.11.mlp.c_fc:output" in out and "total: " in out and "every=" in out
    assert cli.main(["plan", "gpt2", "--seq", "16", "--json", "--param-grads", "--peak-tflops", "100"]) == 0
    d = json.loads(capsys.readouterr().out)
    ids = [t["id"] for t in d["targets"]]
    assert "lm_head.weight:param_grad" not in ids and "transformer.wte.weight:param_grad" in ids  # tied: one
    assert d["total"]["bytes"] == sum(t["bytes"] for t in d["targets"]) and d["prediction"]["every_for_budget"] >= 1
    assert d["targets"][0]["dtype"] == "bfloat16" and d["memory"]["state_bytes"] > 0


def test_cli_no_hist_plans_states_without_any_histogram(capsys):
    """--no-hist turns the float buckets off too (the default histogram): each state is then 5 float64 moments and
    5 int64 counts (count, near-zero, NaN, +Inf, -Inf), plus a 1-byte flag per phase in use."""
    pytest.importorskip("transformers")
    assert plan_cli.main(["gpt2", "--seq", "16", "--json", "--totals", "--no-hist"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["memory"]["state_bytes"] == len(d["targets"]) * (5 * 8 + 5 * 8) + 2


def test_cli_llama_presets_and_a_local_config(capsys, tmp_path):
    pytest.importorskip("transformers")
    assert plan_cli.main(["llama-7b", "--batch", "2", "--seq", "8", "--totals", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    q = next(t for t in d["targets"] if t["id"] == "model.layers.31.self_attn.q_proj:output")
    assert q["shapes"] == [[2, 8, 4096]] and q["bytes"] == 2 * 8 * 4096 * 2
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "gpt2", "n_layer": 1, "n_embd": 8, "n_head": 2, "vocab_size": 11,
                               "n_positions": 6}))
    assert plan_cli.main([str(cfg), "--dtype", "fp32", "--device", "cpu", "--totals"]) == 0
    assert "op time per measured step" in capsys.readouterr().out
    assert plan_cli.main([str(cfg), "--seq", "7"]) == 2
    assert "longer than the model's 6 positions" in capsys.readouterr().err
    assert plan_cli.main(["no-such-model"]) == 2
    assert "neither a preset" in capsys.readouterr().err


def test_llama_70b_preset_is_built_on_meta_with_llama_2_70b_shapes():
    """The 70B plan itself takes ~10 s of CPU (benchmarks/plan_validation.py times it): too slow for a test."""
    pytest.importorskip("transformers")
    from hookstats.tools import presets
    model, (ids,), kw = presets.build("llama-70b", batch=2, seq=4096)
    params = list(model.parameters())
    assert all(p.is_meta and p.dtype == torch.bfloat16 for p in params)
    assert sum(p.numel() for p in params) == 68_976_648_192  # Llama 2 70B's published count
    assert ids.shape == (2, 4096) and kw["labels"] is ids


def test_cli_help_and_bad_arguments(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["plan", "--help"])
    assert e.value.code == 0 and "--peak-tflops" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        cli.main(["plan", "gpt2", "--batch", "0"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "must be >= 1" in err


@pytest.mark.parametrize("argv, match", [
    (["--budget", "-1"], "--budget: must be a finite number > 0, got -1"),
    (["--budget", "inf"], "--budget: must be a finite number > 0, got inf"),
    (["--step-time", "-1"], "--step-time: must be a finite number > 0, got -1"),
    (["--step-time", "nan"], "--step-time: must be a finite number > 0, got nan"),
    (["--peak-tflops", "0"], "--peak-tflops: must be a finite number > 0, got 0"),
    (["--peak-tflops", "fast"], "--peak-tflops: not a number: 'fast'"),
    (["--peak-tflops", "1e300"], "--peak-tflops: must be a finite number > 0, got 1e300"),  # inf FLOP/s
    (["--seq", "0"], "--seq: must be >= 1, got 0"),
    (["--steps", "-3"], "--steps: must be >= 1, got -3"),
    (["--every", "1.5"], "--every: not an integer: '1.5'"),
])
def test_cli_numeric_options_are_checked_before_planning(argv, match, capsys, monkeypatch):
    def no_plan(*args, **kwargs):
        raise AssertionError("planned before the arguments were checked")
    monkeypatch.setattr(plan_cli, "plan", no_plan)
    with pytest.raises(SystemExit) as e:
        cli.main(["plan", "gpt2", *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and match in err


def test_numpy_scalar_arguments_plan_to_plain_json():
    import numpy as np
    p = plan(CNN(), torch.ones(1, 3, 4, 4), speed=False, every=np.int64(2), history=np.int64(3), keep=np.int32(7))
    d = json.loads(json.dumps(p.to_dict()))
    assert d["total"]["every"] == 2 and d["memory"]["host_history_bytes"] > 0 and "after 7 measured steps" in p.table()


@pytest.mark.parametrize("cfg,mean_of", [
    (hookstats.StatsConfig(), lambda full, skip: (full + 9 * skip) / 10),  # defaults: buckets on one step in 10
    (hookstats.StatsConfig(hist_every=1), lambda full, skip: full),
    (hookstats.StatsConfig(hist_every=4, linear_hist=True, float_hist=False), lambda full, skip: (full + 3 * skip) / 4),
    (hookstats.StatsConfig(float_hist=False, log_hist=False), lambda full, skip: full),  # nothing to skip
])
def test_cpu_op_time_is_the_mean_over_the_histogram_cadence(cfg, mean_of):
    """A train step's op counts the histograms on one measured step in hist_every: plan() predicts the mean call,
    not a call with histograms each time (which put the defaults' CNN figure ~40% high)."""
    speed = op_speed.MeasuredSpeed(cfg, sizes=(16, 1024), repeats=1, pool=1 << 12)
    modes = []

    def timed(buf, n, mode=1):
        modes.append(mode)
        return {1: 10e-6, 1 | hookstats.layout.SKIP_HIST: 2e-6}[mode] * n  # the op's flag values: all, no histograms
    speed.time_calls = timed
    got = speed.measure(torch.float32)
    assert got == pytest.approx([mean_of(10e-6 * n, 2e-6 * n) for n in (16, 1024)])
    assert set(modes) == ({1, 3} if mean_of(1.0, 0.0) != 1.0 else {1})


def test_h200_figures_at_measured_points_and_over_the_histogram_cadence():
    """plan()'s CUDA figures: the H200's measured calls (benchmarks/results/gpu_h200.json) at the sizes measured, and
    with hist_every=N one step in N counting the histograms at their rate, the others at the skip rate."""
    import json
    import pathlib
    res = json.loads((pathlib.Path(__file__).parent.parent / "benchmarks" / "results" / "gpu_h200.json").read_text())
    row = res["results"]["bfloat16 256 MB N(0,1)"]
    MB = op_speed.MB
    one = op_speed.H200Speed(hookstats.StatsConfig(hist_every=1))
    n = 256 * MB // 2
    t = one.seconds(torch.bfloat16, n)
    assert math.isclose(t, 11.03e-6 + (256 * MB - MB) / (row["buckets_gbps"] * 1e9))
    assert math.isclose(one.seconds(torch.bfloat16, 2048), res["results"]["bfloat16 4 KB, per call"]["graph_us"] * 1e-6)
    assert math.isclose(one.seconds(torch.bfloat16, MB // 2), res["results"]["bfloat16 1024 KB, per call"]["graph_us"] * 1e-6)
    ten = op_speed.H200Speed(hookstats.StatsConfig(hist_every=10))
    skip = 11.03e-6 + (256 * MB - MB) / (row["skip_step_gbps"] * 1e9)
    assert math.isclose(ten.seconds(torch.bfloat16, n), (t + 9 * skip) / 10)
    assert isinstance(op_speed.speed_for("cuda", hookstats.StatsConfig()), op_speed.H200Speed)
    assert f"the kernel at {res['commit']}," in op_speed.H200Speed.source  # the plan names the kernel it speaks for
