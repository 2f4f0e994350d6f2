"""The sinks with float buckets (float_hist=True, no linear range): TensorBoard's `hist` is the linear view
fitted to the buckets, `log2_abs` the log2 |x| histogram; JSONL keeps the buckets sparse; CSV and W&B get
the quantile and relative near-zero scalars. Read back with TensorBoard's reader, json, csv and W&B's
offline run file, against NumPy of each step's tensors (float_oracle's buckets, numpy.quantile)."""
import json

import numpy as np
import pytest
import torch
from float_oracle import float_counts, float_slots
from helpers import hist_step
from test_float_statistics import REL, assert_quantiles, log2_oracle, near_zero_rel_oracle
from test_sinks import tb_events
from torch import nn
from wandb_file import offline_history

import hookstats
from hookstats.sinks import CSVSink, JSONLSink, TensorBoardSink, read_csv, read_jsonl

pytestmark = pytest.mark.filterwarnings("error::hookstats.history.HistoryWarning")


def train(sinks, steps=4):
    """Outputs of layer 0 per step, measured with the float buckets and no linear histogram."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 300), nn.ReLU(), nn.Linear(300, 3))
    mon = hookstats.attach(model, steps="manual", sinks=sinks, log_every=1, float_hist=True, linear_hist=False, hist_every=1,
                           grads=False)
    outs = []
    for s in range(steps):
        x = torch.randn(8, 5) * 10.0 ** (2 * s - 3)  # scales 1e-3 .. 1e3: no fixed range fits them all
        with torch.no_grad():
            model(x)
            outs.append(nn.functional.linear(x, model[0].weight, model[0].bias).numpy().ravel())
        mon.step()
    mon.remove()
    return outs


def assert_fitted_view(limits, counts, lo, values, own_range=True):
    """A fitted histogram (upper edges `limits`, lower edge `lo`) against the values: the counts add up to n;
    below every edge the view's cumulative count differs from the true one by at most the values sharing
    that edge's float bucket (a bucket's count is spread uniformly over its span) + 1 (rounding). own_range
    (a view fitted to these values alone): the range holds their p0.1 .. p99.9 and most bins are used."""
    edges = np.concatenate([[lo], limits])
    counts = np.asarray(counts)
    assert counts.sum() == len(values)
    true_cum = np.array([(values < e).sum() for e in edges[1:-1]])
    got_cum = np.cumsum(counts)[:-1]
    slots = float_slots(values.astype(np.float32))
    straddling = np.array([(slots == float_slots(np.float32([e]))[0]).sum() for e in edges[1:-1]])
    assert np.all(np.abs(got_cum - true_cum) <= straddling + 1)
    if not own_range:
        return
    p_lo, p_hi = np.quantile(values, [0.001, 0.999], method="inverted_cdf")
    assert edges[0] <= p_lo + REL * abs(p_lo) and edges[-1] >= p_hi - REL * abs(p_hi)
    assert np.count_nonzero(counts) >= len(counts) // 2  # not one bright bin


def test_tensorboard_hist_is_the_fitted_view_and_log2_abs_the_log2_histogram(tmp_path):
    outs = train([TensorBoardSink(tmp_path)])
    acc = tb_events(tmp_path)
    hists = acc.Histograms("hookstats/0/output/hist")
    logs = acc.Histograms("hookstats/0/output/log2_abs")
    assert [e.step for e in hists] == [e.step for e in logs] == [0, 1, 2, 3]
    for ev, lg, values in zip(hists, logs, outs):
        h = ev.histogram_value
        assert h.num == len(values) and h.sum == pytest.approx(values.sum(), rel=1e-4, abs=1e-6)
        assert h.min == pytest.approx(values.min()) or h.min > values.min()
        assert_fitted_view(list(h.bucket_limit), list(h.bucket), h.min, values)
        want = log2_oracle(values)[1:]
        nz = np.flatnonzero(want)
        assert list(lg.histogram_value.bucket) == list(want[nz[0]: nz[-1] + 1])
    scalars = acc.Tags()["scalars"]
    assert "hookstats/0/output/near_zero_rel" in scalars and "hookstats/0/output/near_zero" in scalars
    got = [e.value for e in acc.Scalars("hookstats/0/output/near_zero_rel")]
    np.testing.assert_allclose(got, [near_zero_rel_oracle(v)[0] for v in outs], rtol=1e-6, atol=1e-9)


def test_jsonl_stores_the_buckets_sparsely_and_reads_them_back(tmp_path):
    path = tmp_path / "h.jsonl"
    outs = train([JSONLSink(path)])
    lines = [json.loads(line) for line in open(path) if '"0:output"' in line]
    assert all(isinstance(line["float_hist"], dict) and isinstance(line["log2_hist"], dict) for line in lines)
    assert all(len(line["float_hist"]) < 200 for line in lines)  # the occupied slots only, not 4096
    items, _ = read_jsonl(path)
    for line in lines:  # without the log2 slots (a file cut down by hand), read_jsonl sums them from the buckets
        del line["log2_hist"]
    (tmp_path / "no_log2.jsonl").write_text("".join(json.dumps({"type": "stats", **line}) + "\n" for line in lines))
    derived = {s: r["log2_hist"] for s, r in read_jsonl(tmp_path / "no_log2.jsonl")[0]}
    for s, values in enumerate(outs):
        np.testing.assert_array_equal(derived[s], log2_oracle(values))
    got = {s: r for s, r in items if r["target"] == "0:output"}
    for s, values in enumerate(outs):
        np.testing.assert_array_equal(got[s]["float_hist"], float_counts(values))
        np.testing.assert_array_equal(got[s]["log2_hist"], log2_oracle(values))
        assert_quantiles(got[s], values)


def test_csv_has_the_quantiles_and_the_relative_near_zero(tmp_path):
    path = tmp_path / "h.csv"
    outs = train([CSVSink(path)])
    items, _ = read_csv(path)
    got = {s: r for s, r in items if r["target"] == "0:output"}
    for s, values in enumerate(outs):
        assert_quantiles(got[s], values)
        share, t = near_zero_rel_oracle(values)
        assert got[s]["near_zero_rel"] == pytest.approx(share) and got[s]["near_zero_rel_threshold"] == t


def test_wandb_gets_the_fitted_view_and_the_new_scalars(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from hookstats.sinks import WandbSink
    monkeypatch.setenv("WANDB_SILENT", "true")
    sink = WandbSink(mode="offline", dir=str(tmp_path), project="hookstats-test")
    run = sink.run
    outs = train([sink], steps=3)
    rows = offline_history(run, min_rows=3)
    for r, values in zip(rows, outs):
        bins, counts = r["hookstats/0/output/hist/bins"], r["hookstats/0/output/hist/values"]
        assert_fitted_view(bins[1:], counts, bins[0], values)
        assert r["hookstats/0/output/near_zero_rel"] == pytest.approx(near_zero_rel_oracle(values)[0])
        want = log2_oracle(values)[1:]
        nz = np.flatnonzero(want)
        assert r["hookstats/0/output/log2_abs/values"] == list(want[nz[0]: nz[-1] + 1])


def test_callbacks_histograms_are_the_fitted_view_of_the_windows_buckets(tmp_path):
    """What the HF and Lightning callbacks hand their TensorBoard writers and W&B (integrations/metrics.py):
    the stats() record of a window, its view fitted within the window's exact min and max."""
    from torch.utils.tensorboard import SummaryWriter

    from hookstats.integrations.metrics import measured, tensorboard_histograms, wandb_histograms
    torch.manual_seed(3)
    lin = nn.Linear(4, 500)
    mon = hookstats.attach(lin, float_hist=True, linear_hist=False, grads=False, hist_every=1)
    with torch.no_grad():
        values = np.concatenate([lin(torch.randn(3, 4) * 1e-4).numpy().ravel() for _ in range(2)])
    stats = mon.stats()
    mon.remove()
    writer = SummaryWriter(str(tmp_path))
    targets = list(measured(stats))
    tensorboard_histograms(writer, targets, 7)
    writer.close()
    base = targets[0][0]
    (ev,) = tb_events(tmp_path).Histograms(f"{base}/hist")
    h = ev.histogram_value
    assert ev.step == 7 and h.min >= values.min() and h.bucket_limit[-1] <= values.max()
    assert_fitted_view(list(h.bucket_limit), list(h.bucket), h.min, values)
    pytest.importorskip("wandb")
    got = wandb_histograms(targets)[f"{base}/hist"]
    assert list(got.histogram) == list(h.bucket)


def test_tensorboard_histograms_only_for_histogram_steps(tmp_path):
    """log_every=2: by default (hist_every follows log_every: 2) steps 0, 1 and every second step after count the
    histograms, and each gets a `hist` and a `log2_abs` histogram at its own step, whose counts are that step's
    values (the test's own hooks). With hist_every=10 asked for, step 0, the ramp (1, 2, 4, 8) and step 10 get
    them, two of them in the first window; the steps between get no histogram (not an empty one)."""
    for hist_every in (None, 10):
        model = nn.Sequential(nn.Linear(5, 30), nn.ReLU(), nn.Linear(30, 3))
        seen = []
        model[0].register_forward_hook(lambda m, i, o: seen.append(o.detach().double().reshape(-1).numpy()))
        out = tmp_path / str(hist_every)
        mon = hookstats.attach(model, sinks=[TensorBoardSink(out)], log_every=2, alerts=False, hist_every=hist_every)
        assert mon.cfg.hist_every == (hist_every or 2)
        for _ in range(13):
            model(torch.randn(8, 5)).square().mean().backward()
        mon.remove()
        held = [k for k in range(13) if hist_step(k, 1, mon.cfg.hist_every)]
        assert held == ([0, 1, 2, 4, 6, 8, 10, 12] if hist_every is None else [0, 1, 2, 4, 8, 10])
        acc = tb_events(out)
        for name in ("hist", "log2_abs"):
            events = acc.Histograms(f"hookstats/0/output/{name}")
            assert [ev.step for ev in events] == held, name
            for ev, k in zip(events, held):
                nonzero = int((seen[k] != 0).sum())
                assert sum(ev.histogram_value.bucket) == pytest.approx(seen[k].size if name == "hist" else nonzero)
                assert ev.histogram_value.num == pytest.approx(seen[k].size if name == "hist" else nonzero)
