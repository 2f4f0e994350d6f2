"""What the Lightning and HF callbacks log: the window's statistics merged over ranks, as flat scalars
named `<prefix><module>/<kind><leaf>/<stat>` (characters loggers such as MLflow reject become '_')."""
import re

from .. import distributed
from ..sinks.tensorboard import add_histograms
from ..sinks.wandb import histograms
from ..user_warning import warn_user

DEFAULT_STATS = ("mean", "std", "min", "max", "near_zero", "near_zero_rel", "nan", "posinf", "neginf")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-/ ]")


def window_stats(monitor, phase="train"):
    """The monitor's statistics over every rank (a collective when torch.distributed is initialized:
    every rank must call it), then a reset so the next window starts empty."""
    stats = distributed.reduce(monitor).stats(phase=phase) if distributed.world_size() > 1 else monitor.stats(phase=phase)
    monitor.reset()
    return stats


def flat_metrics(stats, prefix="hookstats/", fields=DEFAULT_STATS):
    """{name: float} for the loggers; targets that saw nothing in the window are left out."""
    out = {}
    for base, rec in measured(stats, prefix):
        for f in fields:
            if f not in rec:
                raise ValueError(f"unknown statistic {f!r}; records have {sorted(k for k in rec if k != 'module')}")
            v = rec[f]
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out[f"{base}/{f}"] = float(v)
    return out


def measured(stats, prefix="hookstats/"):
    """(name base `<prefix><module>/<kind><leaf>`, record) of each target that saw values in the window."""
    for tid, rec in stats.items():
        if rec["count"]:
            yield prefix + _UNSAFE.sub("_", f"{rec['module'] or 'model'}/{tid.split(':', 1)[1]}"), rec


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
