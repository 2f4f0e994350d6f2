"""`python -m hookstats`: the command line (hookstats/tools/cli.py)."""
import sys

from .tools.cli import main

sys.exit(main())
