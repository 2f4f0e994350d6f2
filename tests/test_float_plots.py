"""Charts, summary and `report` with float buckets (float_hist=True, no linear range): the heatmap is the
buckets' linear view over one span for all steps, the dynamic-range shares come from the buckets, the
near-zero panel shows the relative figure; and a run saved without float buckets still reports. Against
NumPy of the measured tensors (a forward/backward hook of the test's own)."""
import numpy as np
import pytest
import torch
from test_float_sinks import assert_fitted_view
from test_float_statistics import near_zero_rel_oracle
from torch import nn

import hookstats
from hookstats.tools import cli, plots
from hookstats.sinks import run_dir_sinks

pytestmark = pytest.mark.usefixtures("every_step_histograms")  # their oracles count every step's histograms

pytest.importorskip("matplotlib")
PNG = b"\x89PNG\r\n\x1a\n"
STEPS = 6


def train(sinks=(), float_hist=True, seed=0):
    """Per step, the values of 0:output and 0:grad_output (hooks of the test's own)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 2))
    seen = {"0:output": [], "0:grad_output": []}
    model[0].register_forward_hook(lambda m, i, o: seen["0:output"].append(o.detach().double().numpy().ravel()))
    model[0].register_full_backward_hook(
        lambda m, gi, go: seen["0:grad_output"].append(go[0].detach().double().numpy().ravel()))
    # without float buckets: what the version before them measured by default (a fixed [-10, 10] range)
    kw = dict(float_hist=True, linear_hist=False) if float_hist else dict(float_hist=False, nbins=40, lo=-10, hi=10)
    mon = hookstats.attach(model, history=True, sinks=list(sinks), log_every=1, **kw)
    for s in range(STEPS):
        model(torch.randn(16, 8) * (1 + s)).square().mean().backward()
    mon.remove()
    return mon, seen


@pytest.fixture(scope="module")
def run():
    mon, seen = train()
    return plots.collect(mon.history_sink.items()), mon, seen


def test_heatmap_is_the_float_view_over_one_span(run, tmp_path):
    series, _, seen = run
    for kind in ("output", "grad_output"):
        s = series[f"0:{kind}"]
        assert s["hist"] is None and s["float_view"].shape == (STEPS, plots.HEATMAP_BINS)
        edges = s["float_view_edges"]
        for counts, values in zip(s["float_view"], seen[f"0:{kind}"]):
            assert_fitted_view(edges[1:], counts, edges[0], values, own_range=False)
            # one span for all steps: the widest step's p0.1 .. p99.9 is inside it
            p = np.quantile(values, [0.001, 0.999], method="inverted_cdf")
            assert edges[0] <= p[0] + abs(p[0]) / 17 and edges[-1] >= p[1] - abs(p[1]) / 17
        fig = plots.plot_hist_heatmap(series, tmp_path / "h.png", kind=kind)
        img = np.asarray(fig.axes[0].images[0].get_array())
        view = s["float_view"].T.astype(np.float64)
        np.testing.assert_allclose(img, view / view.sum(axis=0))
        # gradients too: no empty heatmap, no single bright bin
        assert (s["float_view"] > 0).sum(axis=1).min() >= 8
    assert (tmp_path / "h.png").read_bytes()[:8] == PNG


def test_dynamic_range_shares_come_from_the_buckets(run, tmp_path):
    series, _, seen = run
    totals = plots.totals(series)
    assert totals["0:output"].shape == (4096,)
    fig = plots.plot_dynamic_range(totals, tmp_path / "dr.png")
    table = np.asarray(fig.axes[1].images[0].get_array())
    row = list(totals).index("0:grad_output")
    v = np.abs(np.concatenate(seen["0:grad_output"]).astype(np.float32).astype(np.float64))
    # fp8 e4m3: smallest subnormal 2**-9, max 448 (both bucket edges: exact)
    under, over = ((v > 0) & (v < 2.0 ** -9)).mean(), (v >= 448).mean()
    cols = [(f, k) for f in plots.FORMATS for k in ("underflow", "overflow")]
    got = dict(zip(cols, table[row]))
    assert got[("fp8 e4m3", "underflow")] == pytest.approx(100 * under)
    assert got[("fp8 e4m3", "overflow")] == pytest.approx(100 * over)
    assert 0 < under < 1  # the check can see something: small gradients fall below fp8's range


def test_layer_stats_near_zero_panel_is_the_relative_figure(run, tmp_path):
    series, _, seen = run
    fig = plots.plot_layer_stats(series, tmp_path / "ls.png")
    nz_ax = fig.axes[2]
    assert "p99" in nz_ax.get_title()
    want = [100 * near_zero_rel_oracle(v.astype(np.float32))[0] for v in seen["0:output"]]
    np.testing.assert_allclose(nz_ax.lines[0].get_ydata(), want, rtol=1e-9, atol=1e-9)


def test_summary_table_shows_the_relative_near_zero_and_quantiles(run):
    from hookstats.tools.summary import stats_table
    _, mon, seen = run
    stats = mon.stats()
    text = str(stats_table([{"target": t, **r} for t, r in stats.items()]))
    header, _, *lines = text.splitlines()
    cols = header.split("  ")
    cols = [c.strip() for c in cols if c.strip()]
    assert cols[6:10] == ["near zero %", "near 0 rel %", "p1 |x|", "p50 |x|"] and cols[10] == "p99 |x|"
    cells = next(ln for ln in lines if ln.startswith("0:output ")).split()
    values = np.abs(np.concatenate(seen["0:output"]))
    assert float(cells[7]) == pytest.approx(100 * near_zero_rel_oracle(values.astype(np.float32))[0], rel=1e-3)
    assert float(cells[9]) == pytest.approx(np.quantile(values, 0.5, method="inverted_cdf"), rel=1 / 8)
    old = str(stats_table([{"target": t, **r, "near_zero_rel": None, "abs_p1": None, "abs_p50": None,
                            "abs_p99": None} for t, r in stats.items()]))
    assert "rel" not in old and "|x|" not in old  # a run without float buckets: the columns as before


@pytest.mark.parametrize("float_hist", [False, True])
def test_report_draws_a_run_with_and_without_float_buckets(tmp_path, capsys, float_hist):
    """float_hist=False writes the files as the version before the float buckets did (no float_hist
    anywhere): report still loads and draws them."""
    run_dir = tmp_path / "run"
    train(run_dir_sinks(run_dir), float_hist=float_hist)
    lines = []
    paths = cli.report(run_dir, log=lines.append)
    names = {p.name for p in paths}
    assert {"layer_stats_output.png", "hist_log2_output.png", "dynamic_range.png"} <= names
    assert "hist_linear_output.png" in names  # the fixed range without buckets, the view with them
    assert all(p.read_bytes()[:8] == PNG for p in paths)
    assert any("0:output" in ln for ln in lines)
