"""A step GradScaler skips (Inf gradients: no optimizer step) as docs/howto/loops.md says: its parameter gradients
are measured at mon.step() with steps="manual", not at all when forwards count steps; the steps it runs are
measured unscaled. Counts, NaN/Inf and moments against the gradients the test reads itself after unscale_()."""
import numpy as np
import pytest
import torch
from torch import nn

import hookstats

SKIPPED = 2


@pytest.mark.parametrize("steps", ["forward", "manual"])
def test_a_skipped_steps_parameter_gradients(steps):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    mon = hookstats.attach(model, param_grads=True, steps=steps, alerts=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    seen = []
    for k in range(5):
        loss = model(torch.randn(4, 6)).square().mean() * (1e35 if k == SKIPPED else 1.0)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        if k != SKIPPED or steps == "manual":
            seen.append(model[0].weight.grad.detach().double().flatten().numpy().copy())
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        if steps == "manual":
            mon.step()
    assert scaler.get_scale() == 2.0 ** 15  # the step was skipped once
    rec = mon.stats()["0.weight:param_grad"]
    mon.remove()
    v = np.concatenate(seen)
    fin = v[np.isfinite(v)]
    assert (rec["count"], rec["nan"], rec["posinf"], rec["neginf"]) == (
        v.size, np.isnan(v).sum(), np.isposinf(v).sum(), np.isneginf(v).sum())
    np.testing.assert_allclose([rec["mean"], rec["std"]], [fin.mean(), fin.std(ddof=1)], rtol=1e-6)
    assert (rec["count"] == 5 * 96) == (steps == "manual")
