"""attach()'s selection, StatsConfig and history arguments: each bad one is one clear error naming the argument
(and the bad element), raised at attach, before anything is hooked."""
import pytest
import torch
from torch import nn

import hookstats
from hookstats import StatsConfig


def model():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


@pytest.mark.parametrize("kwargs, error, words", [
    ({"modules": [0]}, ValueError, ["modules", "0", "int"]),
    ({"modules": [None]}, ValueError, ["modules", "None"]),
    ({"modules": ["0", 1.5]}, ValueError, ["modules", "1.5", "float"]),
    ({"modules": [b"0"]}, ValueError, ["modules", "b'0'", "bytes"]),
    ({"exclude": [3]}, ValueError, ["exclude", "3"]),
    ({"exclude": [None]}, ValueError, ["exclude", "None"]),
    ({"modules": 5}, ValueError, ["modules", "5", "list"]),
    ({"exclude": 3.0}, ValueError, ["exclude", "3.0", "list"]),
    ({"modules": {"0": 1}}, ValueError, ["modules", "dict"]),
    ({"modules": None, "exclude": ["0", ["2"]]}, ValueError, ["exclude", "['2']"]),
])
def test_bad_module_patterns_name_the_argument_and_the_element(kwargs, error, words):
    # a ValueError, as every bad attach() argument (README: Configuration)
    m = model()
    with pytest.raises(error) as e:
        hookstats.attach(m, **kwargs)
    msg = str(e.value)
    for w in words:
        assert w in msg, (w, msg)
    assert "fnmatch" not in msg
    assert not m._forward_hooks and not m[0]._forward_hooks  # nothing hooked


def test_good_patterns_still_work_tuples_and_generators_too():
    m = model()
    for pats in (["0", "2"], ("0", "2"), (p for p in ["0", "2"])):
        with hookstats.attach(m, modules=pats) as mon:
            m(torch.randn(3, 4)).sum().backward()
        assert {k.split(":")[0] for k in mon.stats()} == {"0", "2"}


@pytest.mark.parametrize("kwargs", [
    dict(linear_hist=False, nbins=10, lo=0, hi=1),
    dict(linear_hist=False, nbins=10),
    dict(linear_hist=False, lo=-1.0),
    dict(linear_hist=False, hi=3),
])
def test_a_range_asked_for_with_linear_hist_false_is_a_contradiction(kwargs):
    with pytest.raises(ValueError) as e:
        StatsConfig(**kwargs)
    msg = str(e.value)
    assert "linear_hist=False" in msg
    for k in ("nbins", "lo", "hi"):
        if k in kwargs:
            assert k in msg
    with pytest.raises(ValueError):
        hookstats.attach(model(), **kwargs)


def test_linear_hist_false_alone_and_a_range_alone_stay_valid():
    assert StatsConfig(linear_hist=False).linear_hist is False
    c = StatsConfig(nbins=10, lo=0, hi=1)
    assert c.linear_hist and (c.nbins, c.lo, c.hi) == (10, 0.0, 1.0)
    assert StatsConfig(linear_hist=True, nbins=10).linear_hist


def test_a_history_ring_larger_than_the_device_memory_is_refused_at_attach():
    m = model()
    with pytest.raises(ValueError) as e:
        hookstats.attach(m, history=2 ** 40)
    msg = str(e.value)
    assert "history" in msg and "bytes" in msg and "available" in msg, msg
    assert not m._forward_pre_hooks and not m[0]._forward_hooks  # nothing left hooked
    with pytest.raises(ValueError, match="history"):
        hookstats.attach(m, history=2 ** 40, log_every=5)
    # a sane ring still records every step
    with hookstats.attach(m, history=50, log_every=5) as mon:
        for _ in range(7):
            m(torch.randn(3, 4)).sum().backward()
        assert sorted(set(mon.history()["step"])) == list(range(6))  # step 6 is still open


@pytest.mark.parametrize("bad", [-1, 0, 2.5, "10", [3], None])
def test_history_that_is_not_a_bool_or_a_positive_int_is_one_error(bad):
    with pytest.raises(ValueError, match="history"):
        hookstats.attach(model(), history=bad)


@pytest.mark.parametrize("kwargs, name", [({"start_step": 2 ** 63}, "start_step"), ({"start_step": 2 ** 64}, "start_step"),
                                          ({"keep": 2 ** 64}, "keep"), ({"log_every": 2 ** 63}, "log_every"),
                                          ({"every": 2 ** 70}, "every")])
def test_integer_arguments_past_int64_are_one_error_naming_them(kwargs, name):
    with pytest.raises(ValueError) as e:
        hookstats.attach(model(), **kwargs)
    assert str(e.value).startswith(f"{name} must be an int <= 2^63-1 (int64), got "), e.value
    hookstats.attach(model(), start_step=2 ** 63 - 1).remove()  # the largest int64 is a step


def test_a_sink_class_instead_of_a_sink_is_refused_at_attach():
    from hookstats.sinks import CSVSink
    with pytest.raises(ValueError, match="got the class CSVSink: pass one made of it"):
        hookstats.attach(model(), sinks=[CSVSink])
