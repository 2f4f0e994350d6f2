"""HookStatsCallback for the Hugging Face Trainer: attaches hookstats at train begin, adds each logging
window's statistics (merged over ranks) to the Trainer's logs, removes the hooks at train end."""
from transformers import TrainerCallback
from transformers.integrations import INTEGRATION_TO_CALLBACK

import hookstats

from .metrics import DEFAULT_STATS, flat_metrics, window_stats


class HookStatsCallback(TrainerCallback):
    """One optimizer step is one hookstats step (all its gradient-accumulation micro-batches). At every
    training log (logging_steps, and the summary at train end) the window's statistics since the previous
    log are added to the logs as `<prefix><module>/<kind>/<stat>`; evaluation forwards are not measured.

    The Trainer runs user callbacks after its reporting integrations (TensorBoard, W&B, MLflow...): in
    `callbacks=[...]` the statistics go to `trainer.state.log_history` only; `add_to(trainer)` also hands
    them to the integrations. Either way the console printer does not print them. stats: record fields
    logged; other keywords go to hookstats.attach (modules=, every=, param_grads=, nbins=, ...)."""

    def __init__(self, stats=DEFAULT_STATS, prefix="hookstats/", **attach_kwargs):
        if "steps" in attach_kwargs:
            raise ValueError("steps is set by the callback: one optimizer step is one step")
        if not isinstance(prefix, str) or not prefix:
            raise ValueError(f"prefix must be a non-empty string (it tells hookstats' metrics apart), got {prefix!r}")
        self.fields, self.prefix = tuple(stats), prefix
        self.attach_kwargs = attach_kwargs
        self.monitor = None
        self.to_logs = False  # set by add_to: the callback then runs before the reporting integrations

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is None:
            raise ValueError("HookStatsCallback needs the model: the Trainer passes it to on_train_begin")
        self.monitor = hookstats.attach(model, steps="manual", **self.attach_kwargs)

    def on_step_end(self, args, state, control, **kwargs):
        if self.monitor is not None and self.monitor.attached:
            self.monitor.step()

    def on_log(self, args, state, control, logs=None, **kwargs):
        # every rank runs on_log (the Trainer gathers the loss first), so the merge over ranks is safe here
        if self.monitor is None or logs is None or any(k.startswith(("eval_", "test_")) for k in logs):
            return
        metrics = flat_metrics(window_stats(self.monitor), self.prefix, self.fields)
        if self.to_logs:
            logs.update(metrics)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(metrics)

    def on_train_end(self, args, state, control, **kwargs):
        if self.monitor is not None:
            self.monitor.remove()


def add_to(trainer, **kwargs):
    """Makes a HookStatsCallback(**kwargs) and puts it before the Trainer's reporting integrations, so
    they report its statistics, and a remover of them after the integrations, so the console printer
    does not print them. Returns the callback."""
    cb = HookStatsCallback(**kwargs)
    cb.to_logs = True
    callbacks = trainer.callback_handler.callbacks
    reporters = [i for i, c in enumerate(callbacks) if isinstance(c, tuple(INTEGRATION_TO_CALLBACK.values()))]
    first, last = (reporters[0], reporters[-1] + 1) if reporters else (len(callbacks), len(callbacks))
    callbacks.insert(last, _RemoveFromLogs(cb.prefix))
    callbacks.insert(first, cb)
    return cb


class _RemoveFromLogs(TrainerCallback):
    def __init__(self, prefix):
        self.prefix = prefix

    def on_log(self, args, state, control, logs=None, **kwargs):
        for k in [k for k in logs or () if k.startswith(self.prefix)]:
            del logs[k]
