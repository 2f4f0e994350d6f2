"""StepClock (hookstats/clock.py) on its own: which steps end and when, which are sampled (every=N, pause) and
which count the histograms (the every * hist_every grid), against the rules worked out by hand."""
import pytest
import torch
from torch import nn

from hookstats import layout
from hookstats.clock import StepClock


def make(every=1, hist_every=1, steps="forward", track_eval=False):
    model = nn.Linear(2, 2)
    seen, modes = [], []
    clock = StepClock(model, every=every, hist_every=hist_every, steps=steps, track_eval=track_eval,
                      on_modes=modes.append)
    clock.step_listeners.append(lambda clk, step, sampled, hist, evaluated: seen.append((step, sampled, hist, evaluated)))
    clock.update_active()
    return model, clock, seen, modes


def hand_hist(k, every, hist_every):
    """The histogram steps worked out by hand: sampled steps whose index n = k / every is 0, a multiple of
    hist_every, or on the ramp 1, 2, 4, 8, ... below hist_every (so a short run is not described by step 0 alone)."""
    n, ramp = k // every, {1 << j for j in range(12)}
    return k % every == 0 and (n % hist_every == 0 or (n < hist_every and n in ramp))


def forward(model, clock, train=True):
    model.train(train)
    clock.on_root_forward(model, ())
    clock.on_root_forward_end(model, (), None)


@pytest.mark.parametrize("every,hist_every", [(1, 1), (1, 4), (3, 1), (3, 2), (2, 5), (3, 3), (2, 4)])
def test_forward_steps_follow_the_every_and_hist_every_grid(every, hist_every):
    model, clock, seen, _ = make(every, hist_every)
    for _ in range(31):
        forward(model, clock)
    # 31 train forwards end 30 steps (the last is open); hand rule: sampled k % every == 0, histograms: hand_hist
    assert seen == [(k, k % every == 0, hand_hist(k, every, hist_every), False) for k in range(30)]
    assert clock.step_count == 30


def test_manual_steps_end_only_at_step():
    model, clock, seen, _ = make(every=2, steps="manual")
    for _ in range(5):
        forward(model, clock)
    assert seen == [] and clock.step_count == 0
    for k in range(4):
        forward(model, clock)
        forward(model, clock)
        clock.step()
    assert [s for s, *_ in seen] == [0, 1, 2, 3]
    assert [sampled for _, sampled, _, _ in seen] == [True, False, True, False]


def test_step_call_switches_a_forward_clock_to_manual():
    model, clock, seen, _ = make()
    forward(model, clock)
    forward(model, clock)  # ends step 0
    clock.step()  # ends step 1, and from now on forwards count nothing
    forward(model, clock)
    forward(model, clock)
    assert [s for s, *_ in seen] == [0, 1] and clock.manual


def test_pause_skips_its_steps_without_shifting_the_histogram_grid():
    model, clock, seen, modes = make(every=1, hist_every=3, steps="manual")
    for k in range(9):  # step k is open here
        if k == 5:
            clock.resume()
        forward(model, clock)
        if k == 2:
            clock.pause()  # steps 3 and 4 open paused
        clock.step()
    expected = [(k, not 3 <= k < 5, not 3 <= k < 5 and hand_hist(k, 1, 3), False) for k in range(9)]
    assert seen == expected  # step 3 (a histogram step) is lost to the pause, step 6 still counts them
    # the flags' values (train, eval): paused, nothing; step 8 without the histograms; step 9 (open) with them
    assert (0, 0) in modes and (1 | layout.SKIP_HIST, 1) in modes and modes[-1] == (1, 1)


def test_a_step_resumed_while_open_counts_as_sampled():
    """A step is sampled when it was at any time while open: what ran after resume() was measured."""
    model, clock, seen, _ = make(steps="manual")
    clock.pause()
    clock.step()  # step 0: opened sampled, paused later
    clock.step()  # step 1: paused throughout
    clock.resume()
    clock.step()  # step 2: opened paused, resumed before it ended
    assert [sampled for _, sampled, _, _ in seen] == [True, False, True]


def test_eval_forwards_mark_the_open_step_only_when_tracked():
    for track in (False, True):
        model, clock, seen, _ = make(track_eval=track)
        forward(model, clock)
        forward(model, clock, train=False)  # a validation pass inside step 0
        forward(model, clock)  # ends step 0
        forward(model, clock)  # ends step 1
        assert [e for *_, e in seen] == [track, False]
        assert clock.measures("eval") is track and clock.measures("train")


def test_start_at_opens_that_step():
    model, clock, seen, _ = make(every=4, steps="manual")
    clock.start_at(10)
    clock.step()
    clock.step()
    assert [(s, sampled) for s, sampled, _, _ in seen] == [(10, False), (11, False)]
    clock.start_at(12)
    clock.step()
    assert seen[-1][:2] == (12, True)


@pytest.mark.parametrize("kwargs,name", [({"every": 0}, "every"), ({"hist_every": -1}, "hist_every"),
                                         ({"steps": "epoch"}, "steps")])
def test_bad_arguments_name_themselves(kwargs, name):
    with pytest.raises(ValueError, match=name):
        StepClock(torch.nn.Linear(1, 1), **kwargs)
