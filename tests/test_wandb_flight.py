"""The W&B sink's gradient norms and flights, read back from an offline run's file: the norms against torch's
clip_grad_norm_ total and the test's float64 norm of each p.grad, a flight's table against the test's own float64
std of each output per step."""
import json
import os
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import hookstats

from wandb_file import offline_history, offline_summary

CLIP = 0.4


@pytest.fixture
def wandb_sink(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from hookstats.sinks import WandbSink
    monkeypatch.setenv("WANDB_SILENT", "true")
    return WandbSink(mode="offline", dir=str(tmp_path), project="hookstats-test")


def test_the_grad_norm_rows_hold_torch_s_total_its_clip_coef_and_each_parameter_s_share(wandb_sink):
    run = wandb_sink.run
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    mon = hookstats.attach(model, param_grads=True, history=True, log_every=3, sinks=[wandb_sink], clip_norm=CLIP)
    want = []
    for s in range(5):
        loss = model(torch.randn(32, 10) * (1 + s)).square().mean()
        opt.zero_grad()
        loss.backward()
        total = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=float("inf")).item()
        own = {n: float(np.linalg.norm(p.grad.double().numpy().ravel())) for n, p in model.named_parameters()}
        want.append((total, own))
        opt.step()
    mon.remove()
    rows = [r for r in offline_history(run, min_rows=10) if "hookstats/grad_norm/total" in r]
    assert [r["hookstats/step"] for r in rows] == list(range(5))
    totals = np.array([w[0] for w in want])
    np.testing.assert_allclose([r["hookstats/grad_norm/total"] for r in rows], totals, rtol=1e-5)
    coef = [r["hookstats/grad_norm/clip_coef"] for r in rows]
    np.testing.assert_allclose(coef, np.minimum(1.0, CLIP / (totals + 1e-6)), rtol=1e-5)
    assert min(coef) < 1.0
    for r, (total, own) in zip(rows, want):
        shares = {k.split("/")[2].split(":")[0]: v for k, v in r.items() if k.endswith("/share")}
        assert sorted(shares) == sorted(own)
        for name, norm in own.items():
            np.testing.assert_allclose(shares[name], norm ** 2 / total ** 2, rtol=1e-5)


def test_a_flight_is_a_table_of_the_steps_before_the_alert(wandb_sink):
    run = wandb_sink.run
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 6), nn.Linear(6, 6))
    own = {i: [] for i in range(2)}
    for i, m in enumerate(model):
        m.register_forward_hook(lambda mod, a, out, i=i: own[i].append(out.detach().double().numpy().copy()))
    mon = hookstats.attach(model, steps="manual", history=True, log_every=4, sinks=[wandb_sink],
                           alerts=hookstats.AlertRules(flight=3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for s in range(6):
            if s == 4:
                with torch.no_grad():
                    model[1].weight[0, 0] = float("nan")
            with torch.no_grad():
                model(torch.randn(8, 6))
            mon.step()
        mon.remove()
    (row,) = [r for r in offline_history(run, min_rows=7) if "hookstats/flight/path" in r]
    assert row["hookstats/step"] == 4
    with open(os.path.join(run.dir, row["hookstats/flight/path"])) as f:
        table = json.load(f)
    cells = [dict(zip(table["columns"], d)) for d in table["data"]]
    assert [(c["step"], c["target"]) for c in cells] == [(s, f"{i}:output") for s in (2, 3, 4) for i in range(2)]
    for c in cells:
        values = own[int(c["target"][0])][c["step"]]
        if np.isfinite(values).all():
            np.testing.assert_allclose(c["std"], np.std(values, ddof=1), rtol=1e-6)
        assert c["nan"] == np.isnan(values).sum()
    assert cells[-1]["nan"] > 0 and cells[-2]["nan"] == 0
    (line,) = offline_summary(run, "hookstats/flights")
    assert line.startswith("NaN/Inf in 1:output at step 4") and line.endswith(": steps 2..4 of 2 targets recorded")
