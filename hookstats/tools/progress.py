"""Progress bars of the command line (tqdm, on stderr): off with enabled=False and whenever stderr is not a
terminal, so piped output, logs and tests stay clean."""
import sys


def progress(iterable=None, total=None, desc=None, enabled=True, unit="it"):
    from ..extras import require
    return require("tqdm", "hookstats' progress bars").tqdm(iterable, total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True,
                disable=None if enabled else True)  # None: tqdm's own "off unless a terminal"
