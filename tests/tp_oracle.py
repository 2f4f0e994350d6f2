"""The tensor-parallel tests' oracle: one process measuring the global batch (every data-parallel rank's batch,
the whole sequence) with plain float64 hooks of its own on every Linear and LayerNorm, and the comparison of a
merged record with it."""
import numpy as np
import torch

import hookstats
from hookstats import layout
from helpers import oracle
import tp_blocks
from tp_blocks import STEPS


def single_process(model, dp):
    """{target id: float64 values} that `model` (unparallelized) outputs and receives as gradients."""
    seen = {}

    def keep(name):
        def hook(module, args, out):
            seen.setdefault(f"{name}:output", []).append(out.detach().double().reshape(-1))
            out.register_hook(lambda g: seen.setdefault(f"{name}:grad_output", []).append(g.double().reshape(-1)))
        return hook

    for name, m in model.named_modules():
        if isinstance(m, (torch.nn.Linear, torch.nn.LayerNorm)):
            m.register_forward_hook(keep(name))
    for step in range(STEPS):
        tp_blocks.loss_of(model(torch.cat([tp_blocks.batch(step, d) for d in range(dp)]))).backward()
    return {k: torch.cat(v) for k, v in seen.items()}


def assert_matches(st, x, target, cfg):
    """Counts exact; moments, min/max and the histogram as the oracle's up to the float32 rounding by which a
    sharded matmul differs from a whole one. cfg: the attach() keywords (nbins, lo, hi, ...)."""
    mean, std = x.mean().item(), x.std().item()
    assert st["count"] == x.numel(), target
    assert abs(st["mean"] - mean) <= 1e-5 * (abs(mean) + std), target
    np.testing.assert_allclose(st["std"], std, rtol=1e-5, atol=1e-12, err_msg=target)
    np.testing.assert_allclose([st["min"], st["max"]], [x.min().item(), x.max().item()], rtol=1e-5, err_msg=target)
    cfg = hookstats.StatsConfig(**cfg)
    lin = oracle(x, cfg)[1][layout.LIN_BASE: layout.LIN_BASE + layout.lin_slots(cfg.nbins)]
    assert np.abs(np.asarray(st["hist"]) - lin[1: cfg.nbins + 1]).sum() <= 4, target
