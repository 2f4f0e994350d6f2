"""HookStatsCallback for PyTorch Lightning: attaches hookstats at fit start, logs each window's
statistics (merged over ranks) through the trainer's loggers, removes the hooks at fit end."""
try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the standalone package
    from pytorch_lightning.callbacks import Callback

import hookstats

from .metrics import DEFAULT_STATS, check_every, flat_metrics, window_stats


class HookStatsCallback(Callback):
    """log_every: training batches per logged window (default: the trainer's log_every_n_steps); the
    monitor is reset after each log, so each logged value covers one window. stats: the record fields
    logged; prefix: of every metric name. Other keywords go to hookstats.attach (modules=, every=,
    param_grads=, nbins=, ...). After fit, `callback.monitor` holds the last window's statistics."""

    def __init__(self, log_every=None, stats=DEFAULT_STATS, prefix="hookstats/", **attach_kwargs):
        self.log_every = check_every("log_every", log_every)
        self.fields, self.prefix = tuple(stats), prefix
        self.attach_kwargs = attach_kwargs
        if "steps" in attach_kwargs:
            raise ValueError("steps is set by the callback: one training batch is one step")
        self.monitor = None

    def on_fit_start(self, trainer, pl_module):
        # the strategy has moved (and wrapped) the model by now: states are allocated on its device
        self.monitor = hookstats.attach(pl_module, steps="manual", **self.attach_kwargs)
        self._every = self.log_every or max(1, trainer.log_every_n_steps)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        mon = self.monitor
        if mon is None or not mon.attached:
            return
        mon.step()
        if mon.step_count % self._every == 0:
            self._log(trainer)

    # validation inside fit runs the module in eval mode; pausing keeps it out of the training window
    # even when the LightningModule's own forward (where hookstats sees the mode) is never called
    def on_validation_start(self, trainer, pl_module):
        if self.monitor is not None:
            self.monitor.pause()

    def on_validation_end(self, trainer, pl_module):
        if self.monitor is not None:
            self.monitor.resume()

    def on_fit_end(self, trainer, pl_module):
        self._remove()

    def on_exception(self, trainer, pl_module, exception):
        self._remove()

    def _log(self, trainer):
        metrics = flat_metrics(window_stats(self.monitor), self.prefix, self.fields)
        if metrics and trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)

    def _remove(self):
        if self.monitor is not None:
            self.monitor.remove()
