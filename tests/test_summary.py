"""summary(): layer rows against shapes and parameter counts taken straight from the modules; the forward
it runs leaves training flags, BatchNorm statistics and an attached monitor untouched."""
import numpy as np
import pytest
import torch
from torch import nn

import hookstats
from hookstats.tools.summary import format_table, model_sizes, num_features, stats_table, summary


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.rnn = nn.LSTM(4, 5, batch_first=True)
        self.head = nn.Linear(5, 2)
        self.unused = nn.Linear(2, 2)
        self.head.bias.requires_grad_(False)

    def forward(self, x):
        h = self.bn(self.conv(x)).mean((2, 3))[:, None].expand(-1, 6, -1)
        out, _ = self.rnn(h)
        return self.head(out[:, -1])


def test_rows_match_the_modules_and_the_forward_changes_nothing():
    model = Net()
    model.rnn.eval()  # a submodule's own mode must come back as it was
    x = torch.randn(2, 3, 7, 7)
    bn_before = model.bn.running_mean.clone()
    s = summary(model, x)
    assert [r["layer"] for r in s.rows] == ["conv", "bn", "rnn", "head", "unused"]
    rows = {r["layer"]: r for r in s.rows}
    assert rows["conv"]["output shape"] == "[2, 4, 5, 5]"
    assert rows["rnn"]["output shape"] == "[2, 6, 5] [1, 2, 5] [1, 2, 5]"  # (out, (h, c))
    assert rows["unused"]["output shape"] == "not called"
    for name, r in rows.items():
        m = getattr(model, name)
        assert r["params"] == sum(p.numel() for p in m.parameters()) and r["type"] == type(m).__name__
    assert rows["head"]["trainable"] == "partly" and rows["conv"]["trainable"] == "yes"
    assert model.training and model.bn.training and not model.rnn.training
    assert torch.equal(model.bn.running_mean, bn_before)
    total = sum(p.numel() for p in model.parameters())
    assert s.title == f"Net: {total:,} parameters ({total - 2:,} trainable)"
    text = str(s)
    assert text.splitlines()[1].split() == ["layer", "type", "output", "shape", "params", "trainable"]
    assert s.to_frame().shape == (5, 5)


def test_live_statistics_come_from_the_monitor_and_it_is_not_disturbed():
    model = Net()
    mon = hookstats.attach(model)
    for _ in range(3):
        model(torch.randn(2, 3, 7, 7)).sum().backward()
    before, step = mon.stats(), mon.step_count
    s = summary(model, torch.randn(2, 3, 7, 7), monitor=mon)
    after = mon.stats()
    assert mon.step_count == step and not mon.paused
    for k in before:
        assert before[k]["count"] == after[k]["count"]
    rows = {r["layer"]: r for r in s.rows}
    assert rows["conv"]["mean"] == before["conv:output"]["mean"]
    assert rows["conv"]["std"] == before["conv:output"]["std"]
    assert rows["head"]["near zero %"] == 100 * before["head:output"]["near_zero"]
    if "conv:grad_output" in before:
        assert rows["conv"]["grad std"] == before["conv:grad_output"]["std"]
    assert rows["unused"]["mean"] is None
    mon.remove()


def test_model_sizes_and_num_features():
    body = nn.Sequential(nn.Conv2d(3, 6, 3), nn.ReLU(), nn.Conv2d(6, 9, 3, stride=2))
    x = torch.randn(1, 3, 11, 11)
    want = []
    h = x
    for m in body:
        h = m(h)
        want.append(tuple(h.shape))
    assert model_sizes(body, x) == want
    assert num_features(body, x) == 9
    with pytest.raises(ValueError, match="no dimension 1"):
        num_features(nn.Flatten(0), torch.randn(3))
    with pytest.raises(ValueError, match="model must be an nn.Module"):
        summary(lambda x: x, x)


def test_tables_format_numbers_and_missing_values():
    text = format_table([{"a": "x", "n": 1234567, "v": float("nan")}, {"a": "yy", "n": None, "v": 0.5}],
                        ["a", "n", "v"])
    lines = text.splitlines()
    assert lines[2].split() == ["x", "1,234,567", "nan"] and lines[3].split() == ["yy", "-", "0.5"]
    t = stats_table([{"target": "fc:output", "count": 10, "mean": 0.25, "std": 1.0, "near_zero": 0.5,
                      "min": -1.0, "max": 2.0, "nan": 1, "posinf": 2, "neginf": 0}])
    assert t.splitlines()[2].split() == ["fc:output", "10", "0.25", "1", "-", "-", "50", "-1", "2", "3"]


def test_stats_and_the_table_give_rms_and_l2_of_the_finite_values_against_numpy():
    """rms = sqrt(mean^2 + var_biased) and l2 = sqrt(finite) * rms, over the finite values (NaN/Inf left out), in
    stats() (two steps merged) and in stats_table's columns; the test's own hook and NumPy float64 are the oracle."""
    torch.manual_seed(0)
    lin = nn.Linear(8, 300)
    seen = []
    lin.register_forward_hook(lambda m, i, o: seen.append(o.detach().double().reshape(-1).numpy()))
    mon = hookstats.attach(lin, grads=False)
    for scale in (1.0, 1e3):
        x = torch.randn(4, 8) * scale
        with torch.no_grad():
            out = lin(x)
    x = torch.randn(4, 8)
    x[0, 0] = float("inf")  # a row of Inf/NaN outputs: left out of rms and l2
    with torch.no_grad():
        lin(x)
    mon.remove()
    v = np.concatenate(seen)
    fin = v[np.isfinite(v)]
    rec = mon.stats()["Linear:output"]
    assert rec["finite"] == fin.size < v.size
    np.testing.assert_allclose(rec["rms"], np.sqrt(np.mean(fin ** 2)), rtol=1e-6)  # the moments claim
    np.testing.assert_allclose(rec["l2"], np.linalg.norm(fin), rtol=1e-6)
    row = stats_table([{"target": "Linear:output", **rec}]).splitlines()
    cols = row[0].split()
    cells = dict(zip(cols, row[2].split()))
    assert cells["rms"] == f"{rec['rms']:.4g}" and cells["l2"] == f"{rec['l2']:.4g}"
    assert out.shape == (4, 300)


def test_the_attached_monitor_is_found_without_passing_it_and_counts_non_finite_values():
    model = Net()
    mon = hookstats.attach(model)
    x = torch.randn(2, 3, 7, 7)
    x[0, 0, 0, 0] = float("nan")
    x[1, 1, 2, 2] = float("inf")
    model(x)
    want = mon.stats()["conv:output"]
    rows = {r["layer"]: r for r in summary(model, torch.randn(2, 3, 7, 7)).rows}
    assert rows["conv"]["mean"] == want["mean"]
    assert rows["conv"]["nan/inf"] == want["nan"] + want["posinf"] + want["neginf"] > 0
    mon.remove()
    assert "mean" not in summary(model, torch.randn(2, 3, 7, 7)).rows[0]  # removed: a plain summary again
