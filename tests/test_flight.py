"""The flight recorder (AlertRules(flight=K)): when an alert fires, the K recorded steps up to its step of every
target, with the alert, the first target in step order and its step; checked against the test's own hooks
(float64 NumPy std of each output per step), in the file beside the history and in mon.flights; nothing without
an alert; no host sync in a step; under torch.compile."""
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import hookstats
from hookstats.sinks import JSONLSink
from hookstats.sinks.flight_file import find_flights, read_flight

from helpers import no_host_sync


def chain():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 6))


def run(model, steps, nan_at=None, flight=5, log_every=4, sinks=(), own=None, step_fn=None):
    """Trains `steps` forward steps (torch.no_grad, mon.step() after each); a NaN in model[1].weight before
    step nan_at. own: {module index: [per-step float64 arrays]} filled by the test's own forward hooks."""
    handles = []
    if own is not None:
        for i, m in enumerate(model):
            own[i] = []
            handles.append(m.register_forward_hook(
                lambda mod, a, out, i=i: own[i].append(out.detach().double().numpy().copy())))
    mon = hookstats.attach(model, steps="manual", history=True, log_every=log_every, sinks=list(sinks),
                           alerts=hookstats.AlertRules(flight=flight))
    torch.manual_seed(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for s in range(steps):
            if s == nan_at:
                with torch.no_grad():
                    model[1].weight[0, 0] = float("nan")
            with torch.no_grad():
                (step_fn or model)(torch.randn(8, 6))
            mon.step()
        mon.remove()
    for h in handles:
        h.remove()
    return mon


def test_a_flight_holds_the_k_steps_up_to_the_alert_with_the_first_target_and_its_step(tmp_path):
    own = {}
    mon = run(chain(), 14, nan_at=9, flight=5, sinks=[JSONLSink(tmp_path / "history.jsonl")], own=own)
    (flight,) = mon.flights
    assert (flight.kind, flight.target, flight.step) == ("nonfinite", "1:output", 9)
    assert flight.steps == [5, 6, 7, 8, 9]
    assert flight.targets == ["0:output", "1:output", "2:output"]  # step order
    for i in range(3):
        want = np.array([np.nanstd(own[i][s], ddof=1) if np.isfinite(own[i][s]).all() else np.nan
                         for s in flight.steps])
        got = flight.series("std", f"{i}:output")
        finite = np.isfinite(want)
        np.testing.assert_allclose(got[finite], want[finite], rtol=1e-6)  # the op sums float32 chunks
        nans = np.array([np.isnan(own[i][s]).sum() for s in flight.steps])
        np.testing.assert_array_equal(flight.series("nan", f"{i}:output"), nans)
    assert nans[-1] > 0 and not nans[:-1].any()
    (path,) = find_flights(tmp_path)
    assert path.name == "flight_9.jsonl"
    back = read_flight(path)
    assert (back.step, back.target, back.kind, back.steps, back.targets) == (9, "1:output", "nonfinite",
                                                                             flight.steps, flight.targets)
    np.testing.assert_allclose(back.columns["std"], flight.columns["std"], rtol=1e-15)
    assert back.alerts[0]["target"] == "1:output"


def test_no_flight_without_an_alert(tmp_path):
    mon = run(chain(), 12, sinks=[JSONLSink(tmp_path / "history.jsonl")])
    assert mon.flights == [] and find_flights(tmp_path) == []


def test_k_beyond_the_device_ring_comes_over_several_flushes_and_fewer_steps_than_k_are_all_there_were():
    mon = run(chain(), 14, nan_at=11, flight=9, log_every=2)  # a ring of 2 steps
    assert mon.flights[0].steps == list(range(3, 12))
    mon = run(chain(), 6, nan_at=3, flight=50)
    assert mon.flights[0].steps == [0, 1, 2, 3]


def test_flight_must_be_a_count():
    with pytest.raises(ValueError, match="flight"):
        hookstats.AlertRules(flight=-1)
    with pytest.raises(ValueError, match="flight"):
        hookstats.AlertRules(flight=2.5)


def test_a_step_with_the_flight_recorder_makes_no_host_sync():
    model = chain()
    mon = hookstats.attach(model, steps="manual", history=True, log_every=1000,
                           alerts=hookstats.AlertRules(flight=4))
    x = torch.randn(8, 6)
    with torch.no_grad():
        model(x)
    mon.step()
    with no_host_sync():
        for _ in range(3):
            with torch.no_grad():
                model(x)
            mon.step()
    mon.remove()


def test_the_flight_under_torch_compile():
    model = chain()
    compiled = torch.compile(model)
    mon = run(model, 10, nan_at=6, flight=3, step_fn=compiled)
    assert mon.flights and mon.flights[0].step == 6 and mon.flights[0].target == "1:output"
    assert mon.flights[0].steps == [4, 5, 6]


@pytest.mark.filterwarnings("ignore::hookstats.alerts.AlertWarning")
def test_report_draws_each_flight_and_its_progress_bar_counts_every_chart(tmp_path):
    import contextlib
    import io

    from hookstats.tools import cli

    class Terminal(io.StringIO):  # a stderr that is a terminal: the bar is drawn
        def isatty(self):
            return True

    run(chain(), 14, nan_at=9, flight=5, sinks=[JSONLSink(tmp_path / "history.jsonl")])
    err = Terminal()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        paths = cli.report(tmp_path, tmp_path / "charts", show_progress=True)
    drawn = sorted((tmp_path / "charts").glob("*.png"))
    assert tmp_path / "charts" / "flight_9.png" in drawn and sorted(paths) == drawn
    assert "100%" in err.getvalue() and f"{len(drawn)}/{len(drawn)} " in err.getvalue()
