"""MemorySink.write() from a user's own loop: a histogram None on every record of some writes (steps between
histogram steps, or a loop's first steps) and given on others, or None on some records of one write, is kept exactly as given (the
oracle: deep copies of what was written); a histogram changing size, or the fields changing, is one error that
changes nothing."""
import copy

import numpy as np
import pytest
from test_memory_sink import arrays_reachable, assert_same_items, run

from hookstats.sinks import MemorySink

HISTS = ("hist", "log2_hist", "float_hist")


def run_records(config):
    """The records a real run hands its sinks (log_every=3, hist_every 3: the float buckets on steps 0, 1, 2, then
    every third step)."""
    _, oracle, _ = run(1000, **config)
    return oracle.steps


def thin(writes, pattern):
    """Copies of the writes with histograms set to None: on every record of the writes pattern(i, None) picks,
    and on the records pattern(i, j) picks."""
    out = []
    for i, (step, recs) in enumerate(writes):
        recs = copy.deepcopy(recs)
        for j, r in enumerate(recs):
            if pattern(i, None) or pattern(i, j):
                for k in HISTS:
                    if k in r:
                        r[k] = None
        out.append((step, recs))
    return out


def assert_keeps(sink, writes, keep):
    kept = writes[-keep:] if keep else writes
    want = [(s, r) for s, recs in kept for r in recs]
    assert_same_items(sink, want)
    assert sink.nbytes() == sum(a.nbytes for a in arrays_reachable(sink))


PATTERNS = {
    "the run's own, none between histogram steps": lambda i, j: False,  # steps 4, 5, 7, 8, ... carry no buckets
    "none on the first writes, every histogram": lambda i, j: j is None and i < 4,
    "none on some records of a write": lambda i, j: j is not None and (i + j) % 3 == 0,
    "given late, after the window filled": lambda i, j: j is None and i < 9,
    "given on the first write only": lambda i, j: j is None and i > 0,
}


@pytest.mark.parametrize("config", [{}, {"nbins": 7}], ids=["buckets", "buckets+linear"])
@pytest.mark.parametrize("keep", [None, 4])
@pytest.mark.parametrize("pattern", PATTERNS, ids=list(PATTERNS))
def test_write_keeps_histograms_given_on_some_writes_or_records_only(config, keep, pattern):
    writes = thin(run_records(config), PATTERNS[pattern])
    given_first = pattern in ("the run's own, none between histogram steps", "given on the first write only")
    assert (writes[0][1][0]["float_hist"] is not None) == given_first
    assert any(r["float_hist"] is None for _, recs in writes[1:] for r in recs)
    assert any(r["float_hist"] is not None for _, recs in writes[1:] for r in recs) != (pattern == "given on the first write only")
    sink = MemorySink(max_steps=keep)
    for step, recs in writes:
        sink.write(step, copy.deepcopy(recs))
    assert_keeps(sink, writes, keep)


def test_write_steps_and_write_mixed():
    """A sink fed by the history (write_steps, the steps without buckets as read-only rows) and by write() with
    and without histograms gives back what each gave it."""
    writes = run_records({})
    sink = MemorySink()
    later = thin(writes[6:], lambda i, j: j is not None and j % 2 == 0)
    for step, recs in writes[:6]:
        sink.write(step, copy.deepcopy(recs))
    for step, recs in later:
        sink.write(step, copy.deepcopy(recs))
    assert_keeps(sink, writes[:6] + later, None)


def test_a_histogram_changing_size_or_the_fields_changing_is_one_error_that_changes_nothing():
    writes = run_records({})
    sink = MemorySink()
    for step, recs in writes[:3]:
        sink.write(step, copy.deepcopy(recs))
    recs = copy.deepcopy(writes[4][1])  # a step without buckets (step 3 carries its window's)
    recs[0]["float_hist"] = np.zeros(100, dtype=np.int64)
    recs[0]["float_hist"][3] = 1
    with pytest.raises(ValueError, match="changed size.*float_hist"):
        sink.write(writes[4][0], recs)
    recs = copy.deepcopy(writes[4][1])
    for r in recs:
        del r["near_zero_rel"]
    with pytest.raises(ValueError, match="changed fields"):
        sink.write(writes[4][0], recs)
    # a bucket step of two targets (a run with histograms every step: its window of steps 3-5 holds some)
    recs = copy.deepcopy(run_records({"hist_every": 1})[5][1])
    assert len(recs) > 1 and all(r["log2_hist"] is not None for r in recs)
    recs[-1]["log2_hist"] = np.ones(3, dtype=np.int64)
    with pytest.raises(ValueError, match="log2_hist.*differ in size"):
        sink.write(writes[3][0], recs)
    assert_keeps(sink, writes[:3], None)


@pytest.mark.parametrize("keep", [1, 2])
def test_history_keeping_fewer_steps_than_a_flush_has_steps_without_buckets(keep):
    """log_every=3: a flush hands 2 steps without buckets (read-only rows) at once, more than keep=1 holds."""
    mon, oracle, mine = run(keep)
    for sink in (mine, mon.history_sink):
        assert_keeps(sink, oracle.steps, keep)
