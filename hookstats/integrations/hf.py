"""HookStatsCallback for the Hugging Face Trainer: attaches hookstats at train begin, adds each logging
window's statistics (merged over ranks) to the Trainer's logs and its histograms to the Trainer's
TensorBoard and W&B writers, removes the hooks at train end."""
import os

from ..extras import require

require("transformers", "hookstats.integrations.hf")
import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR  # noqa: E402
from transformers.integrations import INTEGRATION_TO_CALLBACK, TensorBoardCallback, WandbCallback  # noqa: E402

import hookstats  # noqa: E402

from ..sinks.names import PREFIX  # noqa: E402
from ..user_warning import warn_user  # noqa: E402
from .metrics import (DEFAULT_STATS, attach_for_windows, flat_metrics, measured, resume, sent, tensorboard_histograms, wandb_histograms,
                      window_stats)


class HookStatsCallback(TrainerCallback):
    """One optimizer step is one hookstats step (all its gradient-accumulation micro-batches). At every
    training log (logging_steps, and the summary at train end) the window's statistics since the previous
    log are added to the logs as `<prefix><module>/<kind>/<stat>`; evaluation forwards are not measured.

    The Trainer runs user callbacks after its reporting integrations (TensorBoard, W&B, MLflow...): in
    `callbacks=[...]` the statistics go to `trainer.state.log_history` only; `add_to(trainer)` also hands
    them to the integrations, and both histograms (linear, log2 `|x|`; histograms=False for none) to the
    TensorBoard integration's SummaryWriter and the W&B integration's run, under the same names as its
    scalars (`train/<prefix><module>/<kind>/hist`, `.../log2_abs`) at the same global step. Either way the
    console printer does not print them. stats: record fields logged; other keywords go to
    hookstats.attach (modules=, every=, param_grads=, nbins=, ...)."""

    def __init__(self, stats=DEFAULT_STATS, prefix=PREFIX, histograms=True, **attach_kwargs):
        if "steps" in attach_kwargs:
            raise ValueError("steps is set by the callback: one optimizer step is one step")
        if not isinstance(prefix, str) or not prefix:
            raise ValueError(f"prefix must be a non-empty string (it tells hookstats' metrics apart), got {prefix!r}")
        self.fields, self.prefix, self.histograms = tuple(stats), prefix, bool(histograms)
        self.attach_kwargs = attach_kwargs
        self.monitor = None
        self.to_logs = False  # set by add_to: the callback then runs before the reporting integrations
        self.reporters = []  # set by add_to: the Trainer's TensorBoard and W&B callbacks

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is None:
            raise ValueError("HookStatsCallback needs the model: the Trainer passes it to on_train_begin")
        window = getattr(state, "logging_steps", None) or args.logging_steps
        self.monitor = attach_for_windows(model, window if window >= 1 else 1, self.attach_kwargs, state.global_step)
        if state.global_step > 0:  # resumed from the checkpoint of that step
            saved = state_file(args, state)
            if os.path.isfile(saved):
                resume(self.monitor, torch.load(saved, map_location="cpu", weights_only=True), state.global_step,
                       saved)
            else:
                warn_user(f"hookstats: resumed at step {state.global_step} without the monitor's state ({saved} "
                          "is missing: a checkpoint outside output_dir, or saved without this callback): steps go "
                          "on from there, and the first window holds only the steps after the resume")

    def on_save(self, args, state, control, **kwargs):
        """The monitor's step and open window, beside the checkpoint the Trainer has just saved."""
        if self.monitor is not None and self.monitor.attached:
            path = state_file(args, state)
            os.makedirs(os.path.dirname(path), exist_ok=True)  # a rank on a node where the Trainer saved nothing
            torch.save(self.monitor.state_dict(), path)

    def on_step_end(self, args, state, control, **kwargs):
        if self.monitor is not None and self.monitor.attached:
            self.monitor.step()

    def on_log(self, args, state, control, logs=None, **kwargs):
        # every rank runs on_log (the Trainer gathers the loss first), so the merge over ranks is safe here
        if self.monitor is None or logs is None or any(k.startswith(("eval_", "test_")) for k in logs):
            return
        stats = window_stats(self.monitor)
        metrics = flat_metrics(stats, self.prefix, self.fields)
        if self.to_logs:
            logs.update(metrics)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(metrics)
        if self.histograms and state.is_world_process_zero:
            self.histograms = sent("histograms to the Trainer's integrations", _log_histograms, self.reporters,
                                   [("train/" + b, r) for b, r in measured(stats, self.prefix)], state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        if self.monitor is not None:
            self.monitor.remove()


def state_file(args, state):
    """This rank's monitor state in the checkpoint of state.global_step, where the Trainer saves it (output_dir)
    and where resume_from_checkpoint=True finds it."""
    folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
    return os.path.join(folder, f"hookstats_monitor_rank{args.process_index}.pt")


def add_to(trainer, **kwargs):
    """Makes a `HookStatsCallback(**kwargs)` and puts it before the Trainer's reporting integrations, so
    they report its statistics, and a remover of them after the integrations, so the console printer
    does not print them. Returns the callback."""
    cb = HookStatsCallback(**kwargs)
    cb.to_logs = True
    callbacks = trainer.callback_handler.callbacks
    cb.reporters = [c for c in callbacks if isinstance(c, (TensorBoardCallback, WandbCallback))]
    reporters = [i for i, c in enumerate(callbacks) if isinstance(c, tuple(INTEGRATION_TO_CALLBACK.values()))]
    first, last = (reporters[0], reporters[-1] + 1) if reporters else (len(callbacks), len(callbacks))
    callbacks.insert(last, _RemoveFromLogs(cb.prefix))
    callbacks.insert(first, cb)
    return cb


def _log_histograms(reporters, targets, step):
    """Both histograms of each (name, record) through the integrations' own writers, named and stepped
    as they name and step the scalars (train/ prefix, state.global_step; W&B's train/global_step axis)."""
    for rep in reporters:
        if isinstance(rep, TensorBoardCallback) and rep.tb_writer is not None:
            tensorboard_histograms(rep.tb_writer, targets, step)
        elif isinstance(rep, WandbCallback):
            import wandb
            data = wandb_histograms(targets) if wandb.run is not None else None
            if data:
                wandb.run.log({**data, "train/global_step": step})


class _RemoveFromLogs(TrainerCallback):
    def __init__(self, prefix):
        self.prefix = prefix

    def on_log(self, args, state, control, logs=None, **kwargs):
        for k in [k for k in logs or () if k.startswith(self.prefix)]:
            del logs[k]
