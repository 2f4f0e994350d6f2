"""hookstats/records.py as the one builder the readers of records go through: value() reads a statistic from a
record of either scope (stats() or history), record() rebuilds one in the one key and field order, and
last_records() gives `hookstats report` each target's last step with the float-bucket figures of its last window
that had buckets; a record's keys and values from a state the op filled, against NumPy float64 and hand counts."""
import math

import numpy as np
import pytest
import torch

from hookstats import StatsConfig, records, statistics
from hookstats.records import key_fields, stats_records
from hookstats.state import Kind, StateStore, TargetKey


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


def filled(cfg, *tensors_by_key):
    """[(TargetKey, fstate, istate)] host rows after the op counted each key's tensors."""
    store = StateStore(cfg)
    keyed = []
    for key, xs in tensors_by_key:
        st, flag = store.resolve(key, "cpu", "train")
        for x in xs:
            store.accumulate(x, st, flag)
        f, i = StateStore.to_host([st])[id(st)]
        keyed.append((key, f, i))
    return keyed


def test_a_record_holds_its_key_and_every_statistic_of_stats():
    cfg = StatsConfig(nbins=8, lo=-2, hi=2)
    key = TargetKey("encoder.fc", Kind.GRAD_OUTPUT)
    (rec,) = stats_records(filled(cfg, (key, [torch.randn(50)])), cfg, "eval").values()
    assert list(rec)[:5] == ["module", "kind", "leaf", "call", "phase"]
    assert (rec["module"], rec["kind"], rec["leaf"], rec["call"], rec["phase"]) == ("encoder.fc", "grad_output", "",
                                                                                     None, "eval")
    assert set(rec) - {"module", "kind", "leaf", "call", "phase"} == set(statistics.names(statistics.STATS))
    assert key_fields(key, "eval") == {"target": "encoder.fc:grad_output", "module": "encoder.fc",
                                       "kind": "grad_output", "leaf": "", "phase": "eval"}


def test_record_values_match_numpy_float64():
    torch.manual_seed(1)
    x = torch.randn(4097) * 1.5
    x[:7] = 0.0
    x[10], x[11], x[12], x[13] = math.nan, math.inf, -math.inf, math.nan
    cfg = StatsConfig(nbins=10, lo=-2, hi=2, eps=1e-3)
    key = TargetKey("fc", Kind.OUTPUT)
    rec = stats_records(filled(cfg, (key, [x[:2000], x[2000:]])), cfg, "train")["fc:output"]
    v = x.double().numpy()
    fin = v[np.isfinite(v)]
    assert rec["count"] == 4097 and rec["finite"] == len(fin) == 4093
    assert (rec["nan"], rec["posinf"], rec["neginf"]) == (2, 1, 1)
    np.testing.assert_allclose([rec["mean"], rec["std"], rec["var"], rec["min"], rec["max"]],
                               [fin.mean(), fin.std(ddof=1), fin.var(ddof=1), fin.min(), fin.max()], rtol=1e-6)
    np.testing.assert_allclose([rec["rms"], rec["l2"]], [np.sqrt((fin ** 2).mean()), np.linalg.norm(fin)], rtol=1e-6)
    assert rec["near_zero"] == pytest.approx((np.abs(v) <= np.float32(1e-3)).sum() / 4097)
    edges = np.float32(-2) + np.arange(11) / np.float64(np.float32(10 / 4))
    assert rec["hist"].tolist() == np.histogram(fin[(fin >= -2) & (fin < edges[-1])], edges)[0].tolist()
    assert (rec["underflow"], rec["overflow"]) == ((fin < -2).sum(), (fin >= edges[-1]).sum())
    assert rec["hist_count"] == 4093  # the float buckets hold every finite value: no hist_every here


def test_quantiles_come_within_the_buckets_resolution_of_numpy():
    torch.manual_seed(2)
    x = torch.randn(20000).exp()  # positive, spread over several binades
    cfg = StatsConfig()
    rec = stats_records(filled(cfg, (TargetKey("fc", Kind.OUTPUT), [x])), cfg, "train")["fc:output"]
    for q, name in zip(statistics.QUANTILES, statistics.QUANTILE_NAMES):
        want = np.quantile(x.double().numpy(), q)
        assert abs(rec[name] - want) <= want / 8, (name, rec[name], want)  # 3 mantissa bits: 1/8 relative


def test_an_empty_plain_state_is_left_out_beside_its_leaves():
    """A target holding a tuple gets one state per leaf besides the plain-tensor one preallocated before its first
    call: that one is left out while empty, and kept when it is the only one."""
    cfg = StatsConfig()
    plain, leaf = TargetKey("lstm", Kind.OUTPUT), TargetKey("lstm", Kind.OUTPUT, "[0]")
    recs = stats_records(filled(cfg, (plain, []), (leaf, [torch.ones(3)])), cfg, "train")
    assert list(recs) == ["lstm:output[0]"] and recs["lstm:output[0]"]["count"] == 3
    recs = stats_records(filled(cfg, (plain, [])), cfg, "train")
    assert list(recs) == ["lstm:output"] and recs["lstm:output"]["count"] == 0
    assert math.isnan(recs["lstm:output"]["mean"]) and math.isnan(recs["lstm:output"]["std"])
    assert stats_records([], cfg, "train") == {}
