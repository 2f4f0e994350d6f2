"""hookstats.monitor, the import path of the monitor's public names: Monitor (facade.py), attach() (attaching.py)
and the model's attached monitor (registry.py)."""
from .attaching import ATTACH_KEYWORDS, AttachedTwiceWarning, attach  # noqa: F401
from .facade import Monitor  # noqa: F401
from .registry import attached_monitor  # noqa: F401
