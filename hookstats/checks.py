"""The one argument check of the package (check_arg: attach(), History, AlertRules, StatsConfig, the sinks): a
value as a Python bool/int/float/str, or one ValueError naming the argument; and the closest name to a misspelt one."""
import difflib
import math

import numpy as np

F32_MAX = float(np.finfo(np.float32).max)
INT64_MAX = 2 ** 63 - 1


def check_arg(name, value, rule, lo=None, hi=None, lo_open=False):
    """The one argument check of attach(), History, AlertRules and StatsConfig: returns value as a Python
    bool/int/float/str (NumPy scalars are taken wherever Python ones are), or raises a ValueError naming the
    argument. rule: bool, int or float (a finite number that float32 can hold: the kernels' arithmetic) with
    optional bounds lo..hi (lo_open: value > lo), or a tuple of the allowed values."""
    if isinstance(value, np.generic):
        value = value.item()
    elif isinstance(value, str) and type(value) is not str:  # a str Enum (hookstats.Kind) is its value
        value = str.__str__(value)
    if isinstance(rule, tuple):
        if not any(value == c and type(value) is type(c) for c in rule):
            raise ValueError(f"{name} must be one of {', '.join(map(repr, rule))}; got {value!r}")
        return value
    numbers = {bool: (bool,), int: (int,), float: (int, float)}[rule]
    if not isinstance(value, numbers) or rule is not bool and isinstance(value, bool):
        what = {bool: "True or False", int: "an int", float: "a number"}[rule]
        raise ValueError(f"{name} must be {what}, got {type(value).__name__} {value!r}")
    if rule is int and hi is None and value > INT64_MAX:  # the device counters and the files' fields are int64
        raise ValueError(f"{name} must be an int <= 2^63-1 (int64), got {value if value < 10 ** 30 else 'a larger one'}")
    positive = rule is float and lo == 0 and lo_open and hi is None
    if rule is float and not (math.isfinite(value) and abs(value) <= F32_MAX):
        what = "a positive number, finite and" if positive else "a finite number"
        raise ValueError(f"{name} must be {what} within float32's range (|x| <= {F32_MAX:.4g}), got {value!r}")
    if lo is not None and (value <= lo if lo_open else value < lo) or hi is not None and value > hi:
        op, bracket = (">", "(") if lo_open else (">=", "[")
        bounds = f"in {bracket}{lo}, {hi}]" if lo is not None and hi is not None else f"{op} {lo}" if lo is not None else f"<= {hi}"
        bounds = "a positive number" if positive else bounds
        raise ValueError(f"{name} must be {'an int ' if rule is int else ''}{bounds}, got {value!r}")
    return float(value) if rule is float else value


def check_count(name, value, optional=False):
    """A count of steps, slots or rows: an int >= 1 (check_arg), or None where `optional`."""
    return None if optional and value is None else check_arg(name, value, int, lo=1)


def did_you_mean(name, choices):
    """' (did you mean x?)' with the closest of `choices` to `name`, or '' when none is close."""
    close = difflib.get_close_matches(name, choices, n=1)
    return f" (did you mean {close[0]}?)" if close else ""
