"""`python -m hookstats.tools.bench`: the same as `python -m hookstats bench` (and the memory runs' child process)."""
import sys

from .command import main

sys.exit(main(prog="python -m hookstats.tools.bench"))
