"""HookStatsCallback for PyTorch Lightning: attaches hookstats at fit start, logs each window's
statistics (merged over ranks) in the trainer's own logging rows and its histograms through the loggers
that take them (TensorBoardLogger, WandbLogger), removes the hooks at fit end."""
from ..extras import is_missing, missing_extra

try:
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger
except ImportError as e:  # the standalone package
    try:
        from pytorch_lightning.callbacks import Callback
        from pytorch_lightning.loggers import TensorBoardLogger, WandbLogger
    except ImportError as e2:
        if is_missing(e2, "pytorch_lightning") and is_missing(e, "lightning"):
            raise missing_extra("lightning", "hookstats.integrations.lightning") from None
        raise e from None  # lightning is installed and fails to import: its own error

from ..sinks.names import PREFIX
from ..config import check_count
from .metrics import (DEFAULT_STATS, attach_for_windows, flat_metrics, measured, resume, sent, tensorboard_histograms, wandb_histograms,
                      window_stats)


class HookStatsCallback(Callback):
    """A step is one optimizer step with its gradient-accumulation batches (the batches up to one where an
    optimizer stepped, with manual optimization too); param_grads=True measures the gradients each optimizer
    step used, after Lightning's accumulation and clipping. A window ends on each batch where the trainer logs
    (every log_every_n_steps batches that stepped the optimizer; with manual optimization every batch counts,
    from the fit's first): its statistics go through pl_module.log_dict, so they land in the trainer's own rows
    (same step, epoch column, one CSVLogger row), and its histograms (linear and log2 `|x|`, with
    histograms=True) go to each TensorBoardLogger (add_histogram_raw on its SummaryWriter) and WandbLogger
    (wandb.Histogram) at the same step; the monitor is reset after each window. The windows cannot be longer
    than the trainer's logging interval: Lightning repeats a value logged at one step in the rows of its later
    steps. log_every: None, or the trainer's log_every_n_steps (checked). stats: the record fields logged;
    prefix: of every metric name. Other keywords go to hookstats.attach (modules=, every=, param_grads=,
    nbins=, ...). After fit, `callback.monitor` holds the last window's statistics."""

    def __init__(self, log_every=None, stats=DEFAULT_STATS, prefix=PREFIX, histograms=True, **attach_kwargs):
        self.log_every = check_count("log_every", log_every, optional=True)
        self.fields, self.prefix, self.histograms = tuple(stats), prefix, bool(histograms)
        self.attach_kwargs = attach_kwargs
        if "steps" in attach_kwargs:
            raise ValueError("steps is set by the callback: one optimizer step (with its gradient-accumulation "
                             "batches) is one step")
        self.monitor = None
        self._resumed = None  # the monitor's state from the checkpoint fit(ckpt_path=) restores
        self._resumed_batches = None  # and the batches that stepped the optimizer, as the trainer counts them

    def state_dict(self):
        """The monitor's step and open window: Lightning keeps it in each checkpoint, and fit(ckpt_path=)
        resumes the window the checkpoint was saved in. Not with several ranks: Lightning keeps rank 0's state
        only, which every rank would load, each rank's own part of the window lost and rank 0's counted again."""
        mon = self.monitor
        if mon is None or not mon.attached:
            return {}
        return {"batches": self._stepped, **({"monitor": mon.state_dict()} if self._ranks == 1 else {})}

    def load_state_dict(self, state_dict):
        self._resumed, self._resumed_batches = state_dict.get("monitor"), state_dict.get("batches")

    def on_fit_start(self, trainer, pl_module):
        n = trainer.log_every_n_steps
        if self.log_every is not None and self.log_every != n:
            raise ValueError(f"log_every={self.log_every} differs from the trainer's log_every_n_steps ({n}): "
                             "hookstats' windows go out in the trainer's own logging rows; set "
                             "Trainer(log_every_n_steps=...) instead")
        # the strategy has moved (and wrapped) the model by now: states are allocated on its device
        resumed, batches = self._resumed, self._resumed_batches  # restored before fit starts
        self._resumed = self._resumed_batches = None
        if batches is None:
            batches = trainer.global_step if pl_module.automatic_optimization else 0
        self.monitor = attach_for_windows(pl_module, n, self.attach_kwargs, batches)
        if resumed is not None:
            resume(self.monitor, resumed, batches, "the checkpoint fit(ckpt_path=) resumed from")
        self._every, self._global_step, self._ranks = n, trainer.global_step, trainer.world_size
        self._stepped = batches

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        mon = self.monitor
        if mon is None or not mon.attached:
            return
        # A step ends at a batch where an optimizer stepped (global_step counts each optimizer's steps): one ended
        # by a gradient-accumulation batch would measure its partial gradients
        stepped, self._global_step = trainer.global_step != self._global_step, trainer.global_step
        # the trainer logs when the batches that stepped the optimizer reach a multiple of log_every_n_steps:
        # with automatic optimization those are counted by global_step (not by a gradient-accumulation
        # batch), with manual optimization every batch is one
        if pl_module.automatic_optimization:
            if not stepped:
                return
            self._stepped = trainer.global_step
        else:
            self._stepped += 1
        if stepped:
            mon.step()
        if self._every and self._stepped % self._every == 0:
            self._log(trainer, pl_module)

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

    def _log(self, trainer, pl_module):
        stats = window_stats(self.monitor)
        metrics = flat_metrics(stats, self.prefix, self.fields)
        if metrics:
            pl_module.log_dict(metrics, on_step=True, on_epoch=False)
        if self.histograms and trainer.is_global_zero:
            # the trainer logs this batch's row at the optimizer steps taken before it
            self.histograms = sent("histograms to the loggers", self._log_histograms, trainer.loggers,
                                   list(measured(stats, self.prefix)), self._stepped - 1)

    @staticmethod
    def _log_histograms(loggers, targets, step):
        for logger in loggers:
            if isinstance(logger, TensorBoardLogger):
                tensorboard_histograms(logger.experiment, targets, step)
            elif isinstance(logger, WandbLogger):
                data = wandb_histograms(targets)
                if data:
                    logger.log_metrics(data, step=step)  # its own step key and prefix, as for its scalars

    def _remove(self):
        if self.monitor is not None:
            self.monitor.remove()
