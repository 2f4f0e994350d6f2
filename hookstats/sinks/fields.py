"""Checks of what a saved history file holds, field by field, for its readers: a line with a field that is
not what hookstats writes (a list where a number belongs, an integer too large for a float or an int64, a
negative or string count, a step outside 0..2^63-1, a kind, phase or alert kind that hookstats does not write,
an alert without `kind`) is skipped with one
BadRecordWarning naming the file, line and field; the rest of the file is read. Names longer than NAME_MAX
are shortened (their start and end around a hash that keeps different names apart), said once per file."""
import hashlib
import math
import numbers
import re
import warnings

from .. import statistics
from ..alert_row import ALERT_KINDS
from ..phases import PHASES
from ..targets import KINDS
from .runs import HistoryFileWarning

INT64_MAX = 2 ** 63 - 1
NAME_MAX = 1000  # characters of a target/module name kept from a file
COUNTS = frozenset(s for s in statistics.SCALARS if statistics.BY_NAME[s].type == statistics.INT) \
    | {"hist_count", "underflow", "overflow"}
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
WARN_MAX = 10  # bad lines said one by one per file; the rest in one count


class BadRecordWarning(HistoryFileWarning):
    """A line of a saved history was whole but not a valid hookstats record: skipped, the rest read."""


class BadField(ValueError):
    def __init__(self, field, why):
        super().__init__(f"field {field!r}: {why}")


def step(v, field="step"):
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadField(field, f"must be an integer, got {show(v)}")
    if not 0 <= v <= INT64_MAX:
        raise BadField(field, f"must be in 0..2^63-1, got {show(v)}")
    return v


def name(v, field, lines=None):
    """A name field; one longer than NAME_MAX shortened (noted in `lines`, a BadLines)."""
    if not isinstance(v, str):
        raise BadField(field, f"must be a string, got {show(v)}")
    control = _CONTROL.search(v)
    if control:  # printed by report: a terminal would obey an escape sequence
        raise BadField(field, f"holds the control character {control.group()!r}")
    if len(v) > NAME_MAX:
        if lines is not None:
            lines.longest = max(lines.longest, len(v))
        return shorten(v)
    return v


def key(v, field, lines=None):
    """A record's KEY_FIELDS value: `kind` one of Kind's values ("" in files of versions without kinds), `phase`
    "train" or "eval", the others names. Nothing else reaches a reader: a kind names chart files."""
    if field == "kind":
        return word(v, field, ("",) + KINDS)
    if field == "phase":
        return word(v, field, PHASES)
    return name(v, field, lines)


def alert_kind(v):
    return word(v, "kind", ALERT_KINDS)


def word(v, field, vocabulary):
    if not isinstance(v, str):
        raise BadField(field, f"must be a string, got {show(v)}")
    if v not in vocabulary:
        raise BadField(field, f"must be one of {', '.join(repr(w) for w in vocabulary if w)}, got {show(v)}")
    return v


def shorten(text, width=NAME_MAX):
    """text cut to `width` characters: its start, 12 hex digits of its hash between ellipses, its last 100
    characters (the kind and leaf of a target id)."""
    if len(text) <= width:
        return text
    digest = hashlib.sha1(text.encode("utf-8", "replace")).hexdigest()[:12]
    return text[: width - 114] + "\u2026" + digest + "\u2026" + text[-100:]


INT_COUNTS = frozenset(s for s in COUNTS if s in statistics.BY_NAME and statistics.BY_NAME[s].type == statistics.INT)
EXACT = 2 ** 53  # an int up to this converts to float exactly: no check below can fail for it


def scalar(stat, v):
    """A statistic's value: None/NaN as NaN, counts as non-negative integers within int64, the rest as floats."""
    # what json.loads gives for almost every field, settled without the general checks (a history has millions)
    t = type(v)
    if t is float and stat not in COUNTS:
        return v
    if t is int and stat in INT_COUNTS and 0 <= v <= EXACT:
        return v
    if v is None:
        return math.nan
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise BadField(stat, f"must be a number, got {show(v)}")
    try:
        f = float(v)
    except OverflowError:
        raise BadField(stat, f"integer too large for a float ({len(str(abs(v)))} digits)") from None
    if stat in COUNTS and not math.isnan(f):
        if f < 0 or f > INT64_MAX or f != math.floor(f):
            raise BadField(stat, f"must be a count (an integer in 0..2^63-1), got {show(v)}")
        return int(v) if statistics.BY_NAME.get(stat) and statistics.BY_NAME[stat].type == statistics.INT else f
    return f


def count(v, field):
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= INT64_MAX:
        raise BadField(field, f"must be a count (an integer in 0..2^63-1), got {show(v)}")
    return v


def show(v):
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) > 10 ** 30:
        return f"an integer of {len(str(abs(v)))} digits"
    text = repr(v) if isinstance(v, (str, numbers.Number)) or v is None else type(v).__name__
    return text if len(text) <= 60 else text[:57] + "..."


class BadLines:
    """Collects a file's bad lines and warns: one BadRecordWarning per line (the first WARN_MAX), then one
    with the count of the others."""

    def __init__(self, path):
        self.path, self.n, self.longest = path, 0, 0

    def add(self, line, why, stacklevel=4):
        self.n += 1
        if self.n <= WARN_MAX:
            warnings.warn(f"{self.path}:{line}: {why}; line skipped", BadRecordWarning, stacklevel=stacklevel)

    def finish(self, stacklevel=3):
        if self.longest:
            warnings.warn(f"{self.path}: names longer than {NAME_MAX} characters (up to {self.longest}) were "
                          f"shortened to {NAME_MAX}", BadRecordWarning, stacklevel=stacklevel)
        if self.n > WARN_MAX:
            warnings.warn(f"{self.path}: {self.n - WARN_MAX} more bad line(s) skipped", BadRecordWarning,
                          stacklevel=stacklevel)
