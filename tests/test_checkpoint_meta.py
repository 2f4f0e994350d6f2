"""Checkpoints and the meta device: a checkpoint loaded while meta is torch's default device (a model built under
`with torch.device("meta")`) resumes as anywhere else; one whose states were loaded onto meta (map_location="meta")
is one clear error that says how to load it."""
import io

import numpy as np
import pytest
import torch
from torch import nn

import hookstats


def _saved():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 3), nn.ReLU(), nn.Linear(3, 2))
    seen = []
    model[0].register_forward_hook(lambda m, i, o: seen.append(o.detach().double().flatten()))
    with hookstats.attach(model, history=True) as mon:
        for _ in range(3):
            model(torch.randn(4, 5)).sum().backward()
        sd = mon.state_dict()
    return model, sd, torch.cat(seen).numpy()


def test_a_checkpoint_loaded_while_meta_is_the_default_device_resumes():
    model, sd, values = _saved()
    with hookstats.attach(model, history=True) as mon:
        with torch.device("meta"):
            mon.load_state_dict(sd)
        got = mon.stats()["0:output"]
        assert mon.step_count == sd["step"]
        mon.history()  # the history's host buffers are on the CPU, whatever the default device was
    np.testing.assert_allclose(got["mean"], values.mean(), rtol=1e-6)
    assert got["count"] == values.size


def test_a_checkpoint_loaded_onto_meta_is_one_clear_error():
    model, sd, _ = _saved()
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    on_meta = torch.load(buf, map_location="meta", weights_only=True)
    with hookstats.attach(model, history=True) as mon:
        with pytest.raises(ValueError) as e:
            mon.load_state_dict(on_meta)
    msg = str(e.value)
    assert "\n" not in msg and "holds no values" in msg and "map_location='cpu'" in msg, msg
