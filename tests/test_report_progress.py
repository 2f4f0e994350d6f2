"""`hookstats report`'s progress: a bar that counts the history file's bytes while it is read (reading a large run
takes longer than its charts), then the bar of the charts."""
import pytest
import torch
from torch import nn

import hookstats
from hookstats.sinks import base, run_dir_sinks
from hookstats.tools import cli
from hookstats.tools import progress as progress_module


class Recorder:
    """progress()'s stand-in: every bar made and every update, in order, as (desc, what, n)."""

    def __init__(self):
        self.events = []

    def __call__(self, iterable=None, total=None, desc=None, enabled=True, unit="it", **kw):
        assert enabled
        return Bar(self.events, desc, total, unit)


class Bar:
    """What the report asks of a tqdm bar: a context, a settable total, update and refresh."""

    def __init__(self, events, desc, total, unit):
        self.events, self.desc, self.total, self.unit = events, desc, total, unit
        events.append((desc, "made", total))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n=1):
        self.events.append((self.desc, "update", n))

    def refresh(self):
        pass


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(6)])
    mon = hookstats.attach(model, sinks=run_dir_sinks(run, tensorboard=False), log_every=5, alerts=False)
    for _ in range(20):
        model(torch.randn(2, 4)).square().mean().backward()
    mon.remove()
    return run


@pytest.mark.parametrize("history", [None, "history.csv"])
def test_the_bar_advances_while_the_history_is_read(run_folder, tmp_path, monkeypatch, history):
    monkeypatch.setattr(base, "PROGRESS_CHARS", 4096)
    bars = Recorder()
    monkeypatch.setattr(progress_module, "progress", bars)
    target = run_folder if history is None else run_folder / history
    read = run_folder / (history or "history.jsonl")
    size = read.stat().st_size
    assert size > 5 * 4096  # the test's file is read in several parts
    cli.report(target, tmp_path / "charts", log=lambda text: None, show_progress=True)
    reading = [e for e in bars.events if e[0] == f"reading {read.name}"]
    assert reading[0] == (f"reading {read.name}", "made", size)
    counted = [n for _, what, n in reading if what == "update"]
    assert len(counted) > 5 and sum(counted) == size  # every byte (the file is ASCII), part by part
    # all of it before the first chart is drawn
    first_chart = next(i for i, e in enumerate(bars.events) if e[0].startswith("charts of") and e[1] == "update")
    assert bars.events.index(reading[-1]) < first_chart
