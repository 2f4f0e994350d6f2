"""Progress bars of the command line (tqdm, on stderr): off with enabled=False and whenever stderr is not a
terminal, so piped output, logs and tests stay clean. Off, they need no tqdm (a bare GPU machine may lack it)."""
import sys


class _Off:
    """What a disabled bar offers the commands (tqdm's names): iteration, a context, a settable total, `disable`,
    update, refresh and the postfix and description setters doing nothing."""

    disable = True

    def __init__(self, iterable=None, total=None):
        self.iterable, self.total = iterable, total

    def __iter__(self):
        return iter(self.iterable if self.iterable is not None else ())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n=1):
        pass

    def refresh(self):
        pass

    def set_postfix_str(self, s="", refresh=True):
        pass

    def set_postfix(self, ordered_dict=None, refresh=True, **kwargs):
        pass

    def set_description(self, desc=None, refresh=True):
        pass

    def close(self):
        pass


def progress(iterable=None, total=None, desc=None, enabled=True, unit="it", unit_scale=False):
    """unit_scale: counts shown with k, M, G (a file's bytes)."""
    if not enabled:
        return _Off(iterable, total)
    from ..extras import require
    tqdm = require("tqdm", "hookstats' progress bars").tqdm
    return tqdm(iterable, total=total, desc=desc, unit=unit, unit_scale=unit_scale, file=sys.stderr,
                dynamic_ncols=True, disable=None)  # None: off unless a terminal
