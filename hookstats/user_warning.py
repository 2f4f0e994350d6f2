"""warn_user(): a warning shown at the user's line, the first frame outside hookstats and torch. hookstats
warns from hooks, optimizer steps, flushes and remove(), each at its own depth below the user's code."""
import functools
import importlib.util
import os
import sys
import warnings


@functools.cache
def _internal():
    """The folders of hookstats and torch (found without importing torch: reading a saved run warns without it)."""
    torch = importlib.util.find_spec("torch")
    return tuple(os.path.dirname(os.path.abspath(f)) + os.sep for f in (__file__, torch and torch.origin) if f)


def warn_user(msg, category=RuntimeWarning):
    frame, level = sys._getframe(1), 2
    internal = _internal()
    while frame is not None and frame.f_code.co_filename.startswith(internal):
        frame, level = frame.f_back, level + 1
    warnings.warn(msg, category, stacklevel=level)


class WarnOnce:
    """tell(what, msg): warn_user(msg) the first time `what` is told, never again for that `what`."""

    def __init__(self):
        self.told = set()

    def __call__(self, what, msg):
        if what not in self.told:
            self.told.add(what)
            warn_user(msg)
