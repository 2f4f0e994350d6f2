"""The op called with None (or another non-tensor) where a tensor goes: one line naming the argument, from
hookstats.accumulate_ / accumulate_many_ and the reference; no state changed. The expected words are written out
here, not taken from the code under test."""
import pytest
import torch

import hookstats
from hookstats import accumulate, rawstate, reference
from hookstats.config import StatsConfig

CFG = StatsConfig(linear_hist=True, float_hist=False)
ON = torch.tensor([True])
ONE = {"wrapper": lambda: accumulate.accumulate_, "reference": lambda: reference.accumulate_}
MANY = {"wrapper": lambda: accumulate.accumulate_many_, "reference": lambda: reference.accumulate_many_}
NAMES = ("x", "fstate", "istate", "scratch", "enabled")


def _state():
    f = rawstate.empty()
    return f, torch.zeros(CFG.istate_size, dtype=torch.int64), torch.zeros(0, dtype=torch.uint8)


def _snapshot(*tensors):
    return [t.numpy().tobytes() for t in tensors if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("path", list(ONE))
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("bad", [None, 3.0], ids=["None", "float"])
def test_a_non_tensor_argument_is_one_line_naming_it(path, name, bad):
    f, i, s = _state()
    args = dict(x=torch.randn(50), fstate=f, istate=i, scratch=s, enabled=ON, params=CFG.op_params())
    args[name] = bad
    before = _snapshot(f, i)
    got = "None" if bad is None else "float"
    with pytest.raises(RuntimeError) as e:
        ONE[path]()(**args)
    assert str(e.value) == f"hookstats.accumulate_: {name} must be a tensor, got {got}"
    assert before == _snapshot(f, i), "a rejected call changed the state"


@pytest.mark.parametrize("path", list(ONE))
def test_params_none_is_one_line(path):
    f, i, s = _state()
    with pytest.raises(RuntimeError) as e:
        ONE[path]()(torch.randn(5), f, i, s, ON, None)
    assert str(e.value).startswith("hookstats.accumulate_: params must be a list of 5 numbers")
    assert str(e.value).endswith("got None") and "\n" not in str(e.value)


@pytest.mark.parametrize("path", list(MANY))
@pytest.mark.parametrize("which", range(4))
def test_a_none_inside_a_list_names_the_target_and_argument(path, which):
    states = [_state() for _ in range(3)]
    lists = [[torch.randn(20) for _ in range(3)], *[[st[k] for st in states] for k in range(3)]]
    lists[which][2] = None
    before = _snapshot(*(t for st in states for t in st[:2]))
    with pytest.raises(RuntimeError) as e:
        MANY[path]()(*lists, ON, CFG.op_params())
    assert str(e.value) == f"hookstats.accumulate_many_: target[2]: {NAMES[which]} must be a tensor, got None"
    assert before == _snapshot(*(t for st in states for t in st[:2])), "a rejected call changed the state"


@pytest.mark.parametrize("path", list(MANY))
def test_a_list_that_is_none_and_enabled_none(path):
    f, i, s = _state()
    with pytest.raises(RuntimeError) as e:
        MANY[path]()([torch.randn(3)], None, [i], [s], ON, CFG.op_params())
    assert str(e.value) == "hookstats.accumulate_many_: fstates must be a list of tensors, got None"
    with pytest.raises(RuntimeError) as e:
        MANY[path]()([torch.randn(3)], [f], [i], [s], None, CFG.op_params())
    assert str(e.value) == "hookstats.accumulate_many_: enabled must be a tensor, got None"


def test_the_package_exports_the_checked_entry_points():
    assert hookstats.accumulate_ is accumulate.accumulate_ and hookstats.accumulate_many_ is accumulate.accumulate_many_


def _ops():
    if hookstats.backend() != "compiled":
        pytest.skip("the compiled op is not loaded")
    return torch.ops.hookstats


@pytest.mark.parametrize("which", range(4))
def test_torch_ops_schema_check_names_the_list_holding_none(which):
    """torch.ops.hookstats.accumulate_many_ itself: torch's schema check raises before the op, its first line
    naming the argument (kept: the op never sees the call)."""
    ops = _ops()
    states = [_state() for _ in range(2)]
    lists = [[torch.randn(20) for _ in range(2)], *[[st[k] for st in states] for k in range(3)]]
    lists[which][1] = None
    with pytest.raises(RuntimeError) as e:
        ops.accumulate_many_(*lists, ON, CFG.op_params())
    arg = ("xs", "fstates", "istates", "scratches")[which]
    assert f"for argument '{arg}'" in str(e.value).splitlines()[0]


def test_torch_ops_with_x_none_names_x():
    f, i, s = _state()
    with pytest.raises(RuntimeError, match="^hookstats.accumulate_: x must be a tensor, got None"):
        _ops().accumulate_(None, f, i, s, ON, CFG.op_params())


@pytest.mark.parametrize("which", ["fstate", "istate", "scratch", "enabled"])
def test_torch_ops_with_a_none_state_names_it(which):
    """torch.ops.hookstats.accumulate_ itself: a None state is one line naming it (not "tensor does not have a
    device")."""
    f, i, s = _state()
    args = dict(fstate=f, istate=i, scratch=s, enabled=ON)
    args[which] = None
    with pytest.raises(RuntimeError) as e:
        _ops().accumulate_(torch.randn(5), args["fstate"], args["istate"], args["scratch"], args["enabled"],
                           CFG.op_params())
    assert str(e.value).splitlines()[0] == f"hookstats.accumulate_: {which} must be a tensor, got None"