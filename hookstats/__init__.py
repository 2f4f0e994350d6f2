"""hookstats: activation and gradient statistics for PyTorch training, fused into one op, no host sync."""
from .accumulate import accumulate_, accumulate_many_, backend
from .config import StatsConfig
from .entry import attach
from .monitor import Monitor
from .state import Kind, TargetKey
from .alerts import AlertRules
from .flight import Flight
from .grad_norms import GradNorms
from .tools.summary import summary
from .tools.planner import plan

__version__ = "0.1.0"
__all__ = ["attach", "Monitor", "StatsConfig", "TargetKey", "Kind", "accumulate_", "accumulate_many_", "backend", "AlertRules", "Flight", "GradNorms",
           "summary", "plan"]


def __getattr__(name):  # hookstats.plots: the charts (hookstats/tools/plots.py), imported on first use
    if name == "plots":
        from .tools import plots
        return plots
    raise AttributeError(f"module 'hookstats' has no attribute {name!r}")
