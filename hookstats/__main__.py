"""`python -m hookstats`: the command line (hookstats/cli.py)."""
import sys

from .cli import main

sys.exit(main())
