"""hookstats: activation and gradient statistics for PyTorch training, fused into one op, no host sync.

Every public name is imported on first use (PEP 562): `python -m hookstats report` reads a saved run and draws its
charts without importing torch (about 2.5 s of CPU), and a training script that imports hookstats loads the engine
with its first hookstats.attach (or `from hookstats import attach`), the tools (the planner, the summary, the
charts, matplotlib) only when it asks for them."""
import importlib

__version__ = "0.1.0"
# name -> (module, attribute)
PUBLIC = {"attach": ("monitor", "attach"), "Monitor": ("monitor", "Monitor"),
          "StatsConfig": ("config", "StatsConfig"), "TargetKey": ("targets", "TargetKey"), "Kind": ("targets", "Kind"),
          "accumulate_": ("accumulate", "accumulate_"), "accumulate_many_": ("accumulate", "accumulate_many_"),
          "backend": ("accumulate", "backend"), "AlertRules": ("alerts", "AlertRules"), "Flight": ("flight", "Flight"),
          "GradNorms": ("grad_norms", "GradNorms"), "Phase": ("phases", "Phase"), "summary": ("tools.summary", "summary"),
          "plan": ("tools.planner", "plan"), "plots": ("tools.plots", None)}
__all__ = ["attach", "Monitor", "StatsConfig", "TargetKey", "Kind", "Phase", "accumulate_", "accumulate_many_",
           "backend", "AlertRules", "Flight", "GradNorms", "summary", "plan"]


def __getattr__(name):
    if name not in PUBLIC:
        raise AttributeError(f"module 'hookstats' has no attribute {name!r}")
    module, attribute = PUBLIC[name]
    found = importlib.import_module(f"{__name__}.{module}")
    value = found if attribute is None else getattr(found, attribute)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(PUBLIC))
