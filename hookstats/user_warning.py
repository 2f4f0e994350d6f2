"""warn_user(): a warning shown at the user's line, the first frame outside hookstats and torch. hookstats
warns from hooks, optimizer steps, flushes and remove(), each at its own depth below the user's code."""
import os
import sys
import warnings

import torch

_INTERNAL = (os.path.dirname(os.path.abspath(__file__)) + os.sep, os.path.dirname(torch.__file__) + os.sep)


def warn_user(msg, category=RuntimeWarning):
    frame, level = sys._getframe(1), 2
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL):
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
