"""hookstats: activation and gradient statistics for PyTorch training, fused into one op, no host sync."""
from .accumulate import accumulate_, accumulate_many_, backend
from .config import StatsConfig
from .monitor import Monitor, attach
from .targets import Kind, TargetKey
from .phases import Phase
from .alerts import AlertRules
from .flight import Flight
from .grad_norms import GradNorms

__version__ = "0.1.0"
__all__ = ["attach", "Monitor", "StatsConfig", "TargetKey", "Kind", "Phase", "accumulate_", "accumulate_many_",
           "backend", "AlertRules", "Flight", "GradNorms", "summary", "plan"]
LAZY = ("summary", "plan", "plots")


def __getattr__(name):
    """The tools, imported on first use (PEP 562): the planner pulls in FakeTensor and FlopCounterMode, the charts
    matplotlib, and a training script that imports hookstats needs none of them."""
    if name == "summary":
        from .tools.summary import summary as value
    elif name == "plan":
        from .tools.planner import plan as value
    elif name == "plots":
        from .tools import plots as value
    else:
        raise AttributeError(f"module 'hookstats' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(LAZY))
