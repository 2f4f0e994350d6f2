"""summary()'s low-precision column: the formats (and recipes) in which a layer's output or its gradient would lose
more than a threshold of its finite values to underflow plus overflow (hookstats/whatif.py)."""
import math

from .. import whatif
from ..config import check_arg

DEFAULT_THRESHOLD = 0.01
RECIPE_LABELS = {"": "", "_current": " (current)", "_delayed": " (delayed)"}


def column(threshold):
    return f"loses > {100 * threshold:g}%"


def check_threshold(threshold):
    value = check_arg("lowprec_threshold", threshold, float, lo=0)
    if value >= 1:
        raise ValueError(f"lowprec_threshold must be a share in [0, 1), got {threshold!r}")
    return value


def losing(records, threshold):
    """'e4m3, e5m2 (current)': each format and recipe where a record's underflow + overflow share exceeds
    `threshold` ("no" where none does), or None where no record has the shares (no float buckets)."""
    found, known = [], False
    for recipe, label in RECIPE_LABELS.items():
        for fmt in whatif.FORMATS:
            for rec in records:
                u, o = (rec or {}).get(f"{fmt}_underflow{recipe}"), (rec or {}).get(f"{fmt}_overflow{recipe}")
                if u is None or o is None or math.isnan(u) or math.isnan(o):
                    continue
                known = True
                if u + o > threshold and fmt + label not in found:
                    found.append(fmt + label)
    return (", ".join(found) or "no") if known else None
