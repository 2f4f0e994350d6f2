"""records.py on its own: a record's keys and values from a state the op filled with known values, against NumPy
float64 and counts made by hand."""
import math

import numpy as np
import pytest
import torch

from hookstats import StatsConfig, statistics
from hookstats.records import key_fields, stats_records
from hookstats.state import Kind, StateStore, TargetKey


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
