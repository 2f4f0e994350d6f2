"""hookstats/records.py as the one builder the readers of records go through: value() reads a statistic from a
record of either scope (stats() or history), record() rebuilds one in the one key and field order, and
last_records() gives `hookstats report` each target's last step with the float-bucket figures of its last window
that had buckets."""
import math

import numpy as np
import pytest

from hookstats import records


def history_record(step, target="fc:output", phase="train", buckets=True, **stats):
    rec = {"target": target, "module": target.split(":")[0], "kind": "output", "leaf": "", "phase": phase,
           "count": 10, "mean": 0.5 + step, "running_min": -1.0, "running_max": 2.0 + step, "nan": 1, "posinf": 2,
           "neginf": 3, "hist_count": 7.0 if buckets else math.nan, "abs_p50": float(step) if buckets else math.nan,
           "float_hist": np.arange(4096) % 3 if buckets else None}
    rec.update(stats)
    return rec


def test_value_reads_either_scope_and_derives_what_sinks_derive():
    stats_rec = {"target": "fc:output", "min": -3.0, "max": 4.0, "nan": 0, "posinf": 5, "neginf": 0}
    hist_rec = history_record(0)
    assert (records.value(stats_rec, "min"), records.value(stats_rec, "max")) == (-3.0, 4.0)
    assert (records.value(hist_rec, "min"), records.value(hist_rec, "max")) == (-1.0, 2.0)
    assert records.value(hist_rec, "running_max") == 2.0 and records.value(stats_rec, "running_min") == -3.0
    assert records.value(stats_rec, "nonfinite") == 5 and records.value(hist_rec, "nonfinite") == 6
    assert records.value({"target": "t", "nan": 1}, "nonfinite") is None  # an input missing: not a guess
    assert records.value(stats_rec, "std") is None


def test_record_puts_keys_first_then_the_table_order_and_keeps_unknown_fields():
    rec = records.record({"std": 1.0, "later_field": "x", "count": 3, "target": "a:output", "mean": 0.0})
    assert list(rec) == ["target", "module", "kind", "leaf", "phase", "count", "mean", "std", "later_field"]
    assert rec["phase"] == "train" and rec["module"] == ""  # a file of a version without phases
    h = np.zeros(4096, dtype=np.int64)
    h[[10, 2000]] = [3, 4]  # buckets of |x| in [2**-126 * 1.25, ...) and [2**122, ...): log2 slots 2 and 251
    rec = records.record({"target": "a:output", "float_hist": h})
    want = np.zeros(256, dtype=np.int64)
    want[2 + (10 >> 3) - 1], want[2 + (2000 >> 3) - 1] = 3, 4
    np.testing.assert_array_equal(rec["log2_hist"], want)
    assert records.record({"target": "a", "log2_hist": None, "float_hist": h})["log2_hist"] is None


@pytest.mark.parametrize("order", ["forward", "shuffled"])
def test_last_records_take_the_last_step_and_the_last_window_with_buckets(order):
    items = [(0, history_record(0)), (1, history_record(1, buckets=False)), (2, history_record(2, buckets=False)),
             (0, history_record(0, target="g:output")), (3, history_record(3, target="g:output")),
             (1, history_record(1, phase="eval")), (2, history_record(2, phase="eval", buckets=False))]
    if order == "shuffled":
        items = [items[k] for k in np.random.default_rng(0).permutation(len(items))]
    rows, with_buckets = records.last_records(items, ["abs_p50"])
    got = {r["target"]: r for r in rows}
    assert with_buckets and sorted(got) == ["fc:output", "fc:output (eval)", "g:output"]
    assert got["fc:output"]["mean"] == 2.5 and got["fc:output"]["abs_p50"] == 0.0  # step 2, buckets of step 0
    assert got["g:output"]["mean"] == 3.5 and got["g:output"]["abs_p50"] == 3.0
    assert got["fc:output (eval)"]["mean"] == 2.5 and got["fc:output (eval)"]["abs_p50"] == 1.0
    assert all(list(r)[:5] == list(records.KEY_FIELDS) for r in rows)
    rows, with_buckets = records.last_records([(0, history_record(0, buckets=False))], ["abs_p50"])
    assert not with_buckets and math.isnan(rows[0]["abs_p50"])
