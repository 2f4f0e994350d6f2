"""The what-if figure of a run: `hookstats report` draws it when the history holds the what-if fields (and not
otherwise), its cells are the shares of the cast emulation (tests/cast_oracle.py) of the last step's values."""
import numpy as np
import pytest
import torch
from torch import nn

import hookstats
from cast_oracle import lost
from hookstats.sinks import run_dir_sinks
from hookstats.tools import cli
from hookstats.tools.lowprec_plots import GRID_FILE, plot_lowprec_grid, save_run_lowprec

pytestmark = pytest.mark.filterwarnings("ignore::hookstats.alerts.AlertWarning")


def _saved_run(folder, float_hist=True):
    """A two-layer model's run saved to `folder` (log_every=1: every step carries its buckets); the last step's
    output values of the first layer."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    seen = []
    model[0].register_forward_hook(lambda m, i, o: seen.append(o.detach().numpy().ravel()))
    mon = hookstats.attach(model, sinks=run_dir_sinks(folder, tensorboard=False), log_every=1, hist_every=1,
                           float_hist=float_hist)
    for _ in range(3):
        model(torch.randn(16, 8) * 1e-2).square().mean().backward()
    mon.remove()
    return seen[-1]


@pytest.mark.parametrize("float_hist", [True, False])
def test_report_draws_the_what_if_figure_when_the_history_has_its_fields(tmp_path, capsys, float_hist):
    _saved_run(tmp_path / "run", float_hist)
    assert cli.main(["report", str(tmp_path / "run"), "--out", str(tmp_path / "charts"), "--no-progress"]) == 0
    drawn = tmp_path / "charts" / GRID_FILE
    assert drawn.is_file() == float_hist
    assert not float_hist or drawn.stat().st_size > 0


def test_the_figure_cells_are_the_shares_of_the_cast_emulation(tmp_path):
    values = _saved_run(tmp_path / "run")
    history, _ = cli.load_run(tmp_path / "run")
    items = history.items()
    assert save_run_lowprec(history, tmp_path / "charts") == [tmp_path / "charts" / GRID_FILE]
    last = max(s for s, _ in items)
    records = {r["target"]: r for s, r in items if s == last}
    fig = plot_lowprec_grid(records)
    under, over = (np.ma.filled(ax.images[0].get_array(), np.nan) for ax in fig.axes[:2])
    row = list(records).index("0:output")
    # unscaled e4m3 and e5m2 underflow and e5m2 overflow are exact counts (bucket edges): columns 0, 1, 1
    for grid, col, fmt, side in ((under, 0, "e4m3", 0), (under, 1, "e5m2", 0), (over, 1, "e5m2", 1)):
        want = 100 * lost(values, 1.0, fmt)[side].mean()
        assert grid[row, col] == pytest.approx(want, abs=1e-9), (fmt, side)
    assert 0 < under[row, 0] < 100  # some values fall below e4m3's smallest normal 2**-6 unscaled, not all


def test_no_figure_without_the_fields():
    assert save_run_lowprec([(0, {"target": "a:output", "mean": 1.0})], "unused") == []
