"""What the Lightning and HF callbacks log: the window's statistics merged over ranks, as flat scalars
named as every sink names them (hookstats/sinks/names.py: `<prefix><module>/<kind><leaf>/<stat>`)."""
from .. import distributed
from ..phases import Phase
from ..statistics import HIST_FIGURES
from ..sinks.names import PREFIX, record_name, stat_name
from ..sinks.tensorboard import add_histograms
from ..sinks.wandb import histograms
from ..user_warning import warn_user

DEFAULT_STATS = ("mean", "std", "min", "max", "near_zero", "near_zero_rel", "nan", "posinf", "neginf")


def attach_for_windows(model, window, attach_kwargs, start_step=0):
    """hookstats.attach(model, steps="manual", **attach_kwargs) for logging windows of `window` steps: unless the
    caller set hist_every (or a config), the histogram cadence is config.hist_every_for(window, every), so each
    window holds a histogram step and logs the figures of the histograms. start_step: the trainer's step a resumed
    run goes on from (unless the caller set one), so every=N and the histogram steps keep their grid."""
    import hookstats
    from ..config import hist_every_for
    kwargs = dict(attach_kwargs)
    if kwargs.get("hist_every") is None and kwargs.get("config") is None:
        kwargs["hist_every"] = hist_every_for(window or 1, kwargs.get("every", 1))
    kwargs.setdefault("start_step", start_step)
    return hookstats.attach(model, steps="manual", **kwargs)


def resume(monitor, saved, step, where):
    """Loads a checkpoint's monitor state into a monitor attached at `step`; one that does not fit this run (another
    number of ranks, attach options, histogram cadence or hookstats version) is said once, and the run goes on
    from `step` without it, its first window holding only the steps after the resume, instead of failing."""
    from ..user_warning import warn_user
    try:
        monitor.load_state_dict(saved)
    except ValueError as e:
        warn_user(f"hookstats: the monitor's state in {where} does not fit this run ({e}); steps go on from {step} "
                  "without it, and the first window holds only the steps after the resume")


def window_stats(monitor, phase=Phase.TRAIN):
    """The monitor's statistics over every rank (a collective when torch.distributed is initialized:
    every rank must call it), then a reset so the next window starts empty."""
    stats = distributed.reduce(monitor).stats(phase=phase) if distributed.world_size() > 1 else monitor.stats(phase=phase)
    monitor.reset()
    return stats


def flat_metrics(stats, prefix=PREFIX, fields=DEFAULT_STATS):
    """{name: float} for the loggers; targets that saw nothing in the window are left out."""
    out = {}
    for base, rec in measured(stats, prefix):
        for f in fields:
            if f not in rec:
                raise ValueError(f"unknown statistic {f!r}; records have {sorted(k for k in rec if k != 'module')}")
            v = rec[f]
            if isinstance(v, (int, float)) and not isinstance(v, bool) and not (v != v and f in HIST_FIGURES):
                out[stat_name(base, f)] = float(v)  # a window without a histogram step: no NaN point
    return out


def measured(stats, prefix=PREFIX):
    """(name base, sinks/names.py's target_name, record) of each target that saw values in the window."""
    for tid, rec in stats.items():
        if rec["count"]:
            yield record_name(rec, prefix, target=tid), rec


def tensorboard_histograms(writer, targets, step):
    """Both histograms of each (name base, record) to a SummaryWriter."""
    add_histograms(writer, targets, step)


def wandb_histograms(targets):
    """{name: wandb.Histogram} of both histograms of each (name base, record)."""
    import wandb
    return histograms(wandb, targets)


def sent(what, fn, *args):
    """Runs fn(*args); False, with one warning, when it raises: a logger's failure must not stop training."""
    try:
        fn(*args)
        return True
    except Exception as e:
        warn_user(f"hookstats: {what} failed and is switched off: {e!r}")
        return False
