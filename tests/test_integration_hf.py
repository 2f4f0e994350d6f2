"""HookStatsCallback with a real Hugging Face Trainer on CPU and a tiny GPT-2 built from a config (no
download): logged windows vs a float64 NumPy oracle over the same forwards, TensorBoard receives them."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import oracle  # noqa: E402

from hookstats.config import StatsConfig  # noqa: E402
from hookstats.records import finalize  # noqa: E402

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

from hookstats.integrations.hf import HookStatsCallback, add_to  # noqa: E402

pytestmark = pytest.mark.usefixtures("every_step_histograms")  # their oracles count every step's histograms

STEPS, ACCUM, LOG_EVERY = 6, 2, 2
HOOKED = ["transformer.h.0.mlp.c_fc", "transformer.ln_f"]


def tiny_gpt2():
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg)


def dataset(n=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 64, (n, 12), generator=g)
    return [{"input_ids": x, "labels": x} for x in ids]


def train(tmp_path, report_to, place, **cb_kwargs):
    model = tiny_gpt2()
    seen = {n: [] for n in HOOKED}  # training forwards only: the oracle's data
    for n in HOOKED:
        model.get_submodule(n).register_forward_hook(
            lambda m, a, o, n=n: seen[n].append(o.detach().double().clone()) if m.training else None)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=STEPS, per_device_train_batch_size=4,
                             gradient_accumulation_steps=ACCUM, logging_steps=LOG_EVERY, report_to=report_to,
                             save_strategy="no", use_cpu=True, disable_tqdm=True,
                             eval_strategy="steps", eval_steps=3, per_device_eval_batch_size=4, seed=0)
    cb = HookStatsCallback(modules=HOOKED, **cb_kwargs) if place == "callbacks" else None
    trainer = Trainer(model=model, args=args, train_dataset=dataset(), eval_dataset=dataset(8, 1),
                      callbacks=[cb] if cb else None)
    if place == "add_to":
        cb = add_to(trainer, modules=HOOKED, **cb_kwargs)
    trainer.train()
    return trainer, cb, seen


def check_windows(history, seen):
    logs = [h for h in history if "loss" in h]
    assert [h["step"] for h in logs] == list(range(LOG_EVERY, STEPS + 1, LOG_EVERY))
    per_window = LOG_EVERY * ACCUM  # forwards per window: one hookstats step per optimizer step
    for n in HOOKED:
        assert len(seen[n]) == STEPS * ACCUM
    for w, h in enumerate(logs):
        for n in HOOKED:
            x = torch.cat([t.reshape(-1) for t in seen[n][w * per_window:(w + 1) * per_window]]).numpy()
            base = f"hookstats/{n}/output/"
            # the op's float32 accumulation: mean within 1e-6 of (|mean| + std), as in tests/test_accumulate.py
            assert abs(h[base + "mean"] - x.mean()) <= 1e-6 * (abs(x.mean()) + x.std())
            np.testing.assert_allclose(h[base + "std"], x.std(ddof=1), rtol=1e-6)
            np.testing.assert_allclose([h[base + "min"], h[base + "max"]], [x.min(), x.max()], rtol=1e-6)
    assert not any(k.startswith("hookstats/") for h in history if "eval_loss" in h for k in h)


def test_hf_callback_in_callbacks_list_logs_windows_to_log_history(tmp_path, capsys):
    trainer, cb, seen = train(tmp_path, [], "callbacks")
    check_windows(trainer.state.log_history, seen)
    out = capsys.readouterr().out
    assert "'loss'" in out and "hookstats/" not in out  # the console printer shows the Trainer's logs only
    assert not cb.monitor.attached


def test_hf_add_to_reports_through_tensorboard(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    trainer, cb, seen = train(tmp_path, ["tensorboard"], "add_to", stats=("mean", "std", "min", "max"),
                           linear_hist=True)  # the exact linear bins, asked for
    check_windows(trainer.state.log_history, seen)
    assert "hookstats/" not in capsys.readouterr().out
    event_dirs = {os.path.dirname(os.path.join(d, f)) for d, _, fs in os.walk(tmp_path) for f in fs
                  if "tfevents" in f}
    assert event_dirs, "no TensorBoard event file written"
    tag = f"train/hookstats/{HOOKED[0]}/output/mean"
    scalars = {}
    for d in event_dirs:
        acc = EventAccumulator(d)
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            scalars = {e.step: e.value for e in acc.Scalars(tag)}
    logged = {h["step"]: h[tag[len("train/"):]] for h in trainer.state.log_history if "loss" in h}
    assert scalars.keys() == logged.keys()
    np.testing.assert_allclose([scalars[s] for s in logged], list(logged.values()), rtol=1e-6)
    # both histograms of each window, at the scalars' steps, against the oracle's bins
    base = f"train/hookstats/{HOOKED[0]}/output"
    acc = EventAccumulator(next(d for d in event_dirs if tag in EventAccumulator(d).Reload().Tags()["scalars"]),
                           size_guidance={"histograms": 0})
    acc.Reload()
    hists, logs = acc.Histograms(f"{base}/hist"), acc.Histograms(f"{base}/log2_abs")
    assert [e.step for e in hists] == [e.step for e in logs] == sorted(logged)
    for h, lg, want in zip(hists, logs, window_records(seen[HOOKED[0]], StatsConfig(linear_hist=True))):
        assert list(h.histogram_value.bucket) == [want["underflow"], *want["hist"], want["overflow"]]
        nz = np.flatnonzero(want["log2_hist"][1:])
        assert list(lg.histogram_value.bucket) == list(want["log2_hist"][1:][nz[0]: nz[-1] + 1])


def window_records(batches, cfg):
    """The float64 oracle's record of each logging window's forwards."""
    per_window = LOG_EVERY * ACCUM
    return [finalize(*oracle(torch.cat([t.reshape(-1) for t in batches[w * per_window:(w + 1) * per_window]]), cfg),
                     cfg) for w in range(STEPS // LOG_EVERY)]


def test_hf_add_to_reports_histograms_through_wandb(tmp_path, monkeypatch):
    """W&B integration (offline, read back from the run file): both histograms in rows with the
    integration's own train/global_step, the step of the window's scalars."""
    pytest.importorskip("wandb")
    from wandb_file import offline_history
    for k, v in (("WANDB_MODE", "offline"), ("WANDB_DIR", str(tmp_path)), ("WANDB_SILENT", "true"),
                 ("WANDB_PROJECT", "hookstats-test")):
        monkeypatch.setenv(k, v)
    import wandb
    runs = []
    # the run it makes; offline and in tmp_path even where an earlier test fixed wandb's settings in this process
    monkeypatch.setattr(wandb, "init", lambda *a, init=wandb.init, **k: runs.append(
        init(*a, **{**k, "mode": "offline", "dir": str(tmp_path)})) or runs[-1])
    trainer, cb, seen = train(tmp_path, ["wandb"], "add_to", stats=("mean",), linear_hist=True)
    (run,) = runs
    run.finish()
    rows = offline_history(run, min_rows=STEPS // LOG_EVERY)
    base = f"train/hookstats/{HOOKED[0]}/output"
    scalar_steps = [r["train/global_step"] for r in rows if f"{base}/mean" in r]
    hist_rows = [r for r in rows if f"{base}/hist/values" in r]
    assert scalar_steps == [r["train/global_step"] for r in hist_rows] == list(range(LOG_EVERY, STEPS + 1, LOG_EVERY))
    for r, want in zip(hist_rows, window_records(seen[HOOKED[0]], StatsConfig(linear_hist=True))):
        assert r[f"{base}/hist/values"] == [want["underflow"], *map(int, want["hist"]), want["overflow"]]
        nz = np.flatnonzero(want["log2_hist"][1:])
        assert r[f"{base}/log2_abs/values"] == list(want["log2_hist"][1:][nz[0]: nz[-1] + 1])


def test_hf_callback_rejects_steps():
    with pytest.raises(ValueError, match="steps"):
        HookStatsCallback(steps="forward")
    with pytest.raises(ValueError, match="prefix"):
        HookStatsCallback(prefix="")


def test_hf_resume_from_checkpoint_keeps_the_open_window_and_the_step(tmp_path):
    """Saved at step 3, inside the window that the log at step 4 ends: the resumed run logs it whole, with the
    gradients of step 3 (before the save) and step 4 (after), as the optimizer stepped with them (clipped)."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook
    weight = f"{HOOKED[0]}.weight"

    def run(resume=None):
        model = tiny_gpt2()
        args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=STEPS, per_device_train_batch_size=4,
                                 gradient_accumulation_steps=ACCUM, logging_steps=LOG_EVERY, report_to=[],
                                 save_strategy="steps", save_steps=3, use_cpu=True, disable_tqdm=True,
                                 max_grad_norm=0.05, seed=0)
        cb = HookStatsCallback(modules=HOOKED[:1], param_grads=True, stats=("mean", "count"))
        trainer = Trainer(model=model, args=args, train_dataset=dataset(), callbacks=[cb])
        stepped = {}  # optimizer step (from 1) -> the float64 gradient it steps with

        def keep(opt, a, k):
            stepped[trainer.state.global_step + 1] = model.get_parameter(weight).grad.detach().double().clone()
        handle = register_optimizer_step_pre_hook(keep)
        trainer.train(resume_from_checkpoint=resume)
        handle.remove()
        logged = {h["step"]: h for h in trainer.state.log_history if f"hookstats/{weight}/param_grad/count" in h}
        return logged, stepped, cb

    _, first, _ = run()
    logged, again, cb = run(str(tmp_path / "out" / "checkpoint-3"))
    assert sorted(again) == [4, 5, 6] and cb.monitor.step_count == STEPS  # the step goes on from the checkpoint's
    window = torch.cat([first[3].reshape(-1), again[4].reshape(-1)])
    base = f"hookstats/{weight}/param_grad/"
    assert logged[4][base + "count"] == window.numel()
    saved = tmp_path / "out" / "checkpoint-3" / "hookstats_monitor_rank0.pt"
    sd = torch.load(saved, weights_only=True)
    sd["config"]["hist_every"] += 1  # of a run logging at another cadence: it does not fit, and the resume goes on
    torch.save(sd, saved)
    with pytest.warns(RuntimeWarning, match="does not fit this run") as said:
        _, _, cb = run(str(tmp_path / "out" / "checkpoint-3"))
    assert sum("does not fit this run" in str(w.message) for w in said) == 1 and cb.monitor.step_count == STEPS
    os.remove(saved)  # a checkpoint without it: said, and the steps go on from the checkpoint's
    with pytest.warns(RuntimeWarning, match="resumed at step 3 without the monitor's state") as said:
        _, _, cb = run(str(tmp_path / "out" / "checkpoint-3"))
    assert sum("without the monitor's state" in str(w.message) for w in said) == 1 and cb.monitor.step_count == STEPS
    x = window.numpy()  # the op's float32 accumulation: mean within 1e-6 of (|mean| + std)
    assert abs(logged[4][base + "mean"] - x.mean()) <= 1e-6 * (abs(x.mean()) + x.std())
