"""`hookstats report` keeps what lives through a report (the imports, the history read) out of the cyclic collector's
full collections while it draws, and gives the collector back as it found it: nothing stays frozen after a report,
and a caller's own gc.freeze() stays as the caller left it."""
import gc

import pytest
import torch
from torch import nn

import hookstats
from hookstats.sinks import run_dir_sinks
from hookstats.tools import cli


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    mon = hookstats.attach(model, sinks=run_dir_sinks(run, tensorboard=False), log_every=2, alerts=False)
    for _ in range(4):
        model(torch.randn(2, 4)).square().mean().backward()
    mon.remove()
    return run


def test_nothing_stays_frozen_after_a_report(run_folder, tmp_path):
    assert gc.get_freeze_count() == 0
    frozen = []
    real = gc.freeze

    def counted():
        real()
        frozen.append(gc.get_freeze_count())
    gc.freeze = counted
    try:
        cli.report(run_folder, tmp_path / "charts", log=lambda text: None)
    finally:
        gc.freeze = real
    assert len(frozen) == 2 and frozen[1] >= frozen[0] > 0  # the imports, then the history and its series
    assert gc.get_freeze_count() == 0


def test_a_callers_frozen_objects_stay_frozen(run_folder, tmp_path):
    gc.freeze()
    try:
        assert gc.get_freeze_count() > 0
        cli.report(run_folder, tmp_path / "charts", log=lambda text: None)
        assert gc.get_freeze_count() > 0  # not unfrozen by the report (objects freed since are gone from the count)
    finally:
        gc.unfreeze()
