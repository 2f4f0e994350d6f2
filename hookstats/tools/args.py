"""The command line's argument helpers, shared by its commands (cli, planner, bench): a parser whose errors
are one line and exit status 2, and argparse types that name the bad value."""
import argparse
import math


class Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def int_in(lo, hi=None):
    """An argparse type: an integer in [lo, hi]."""
    def parse(text):
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {v}" if v < lo else f"must be <= {hi}, got {v}")
        return v
    return parse


def positive_float(scale=1.0):
    """An argparse type: a finite number > 0 (that stays finite times `scale`, the unit it is used in)."""
    def parse(text):
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not (v > 0 and math.isfinite(v * scale)):
            raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
        return v
    return parse


def comma_list(check):
    """An argparse type: a comma list, each item passed through check(item), which raises ValueError."""
    def parse(text):
        items = [t.strip() for t in text.split(",")]
        if not all(items):
            raise argparse.ArgumentTypeError(f"an empty name in {text!r}")
        try:
            return [check(t) for t in items]
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return parse


def progress_argument(p):
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bars on stderr (there are none either when stderr is not a terminal)")
