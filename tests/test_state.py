"""StateStore (hookstats/state.py) on its own: the slots a state holds for each config (counted by hand from the
layout's rules), its device flags per phase and mode, and its running totals against NumPy float64."""
import math

import numpy as np
import pytest
import torch

from hookstats import StatsConfig
from hookstats.state import PHASES, Kind, StateStore, TargetKey

FLOAT_BUCKETS = 2 * 2 ** 11  # one bucket per float32 sign, exponent and 3 mantissa bits: 2 * 2**(31 - 20)


@pytest.mark.parametrize("cfg,slots", [
    # count, near_zero | NaN, +Inf, -Inf | float buckets
    (StatsConfig(), 2 + 3 + FLOAT_BUCKETS),
    # count, near_zero | under, 8 bins, over | NaN, +Inf, -Inf | float buckets
    (StatsConfig(nbins=8), 2 + 10 + 3 + FLOAT_BUCKETS),
    # without float buckets the kernel keeps its 256 log2 slots
    (StatsConfig(float_hist=False), 2 + 3 + 256),
    (StatsConfig(float_hist=False, log_hist=False, nbins=3, near_zero="le"), 2 + 5 + 3),
])
def test_a_state_holds_the_slots_its_config_measures(cfg, slots):
    store = StateStore(cfg)
    st = store.state(TargetKey("fc", Kind.OUTPUT), "cpu", "train")
    assert st.istate.shape == (slots,) and st.istate.dtype == torch.int64 and not st.istate.any()
    assert st.fstate.dtype == torch.float64  # n_finite, mean, M2, min, max: min/max NaN while empty
    assert st.fstate[:3].tolist() == [0.0, 0.0, 0.0] and st.fstate[3:].isnan().all()
    flag_bytes = len(PHASES)  # a device's first state allocates its 1-byte flag per phase, for compiled code
    assert store.memory()["state_bytes"] == 5 * 8 + slots * 8 + flag_bytes  # no CUDA scratch on the CPU


def test_one_state_per_phase_key_and_device():
    store = StateStore(StatsConfig())
    a, b = TargetKey("fc", Kind.OUTPUT), TargetKey("fc", Kind.GRAD_OUTPUT)
    assert store.state(a, "cpu", "train") is store.state(a, "cpu", "train")
    assert store.state(a, "cpu", "eval") is not store.state(a, "cpu", "train")
    assert store.state(b, "cpu", "train") is not store.state(a, "cpu", "train")
    assert store.state(TargetKey("fc", "output"), "cpu", "train") is store.state(a, "cpu", "train")  # Kind is a str
    assert len(store) == 3
    assert store.states() == []  # none reached yet
    st, flag = store.resolve(a, "cpu", "train")
    assert st.reached and [k for k, _, _ in store.states()] == [a] and store.states(phase="eval") == []


def test_flags_per_device_and_phase_follow_the_mode():
    """The op reads a 1-byte flag: train 0 unsampled, 1 sampled, 3 sampled without histograms; eval 1 unless
    paused. The flags are filled in place (compiled code keeps their addresses)."""
    store = StateStore(StatsConfig())
    store.flags("cpu")
    train, ev = store.flag("cpu", "train"), store.flag("cpu", "eval")
    assert train.dtype == torch.uint8 and train.shape == (1,)
    ptrs = train.data_ptr(), ev.data_ptr()
    for want in [(1, 1), (3, 1), (0, 1), (0, 0), (1, 1)]:
        store.set_modes(want)
        assert (train.item(), ev.item()) == want
    assert (store.flag("cpu", "train").data_ptr(), store.flag("cpu", "eval").data_ptr()) == ptrs
    store.flags("meta")  # every phase of a new device
    assert store.flag("meta", "eval").device.type == "meta"
    assert store.memory()["state_bytes"] == 4  # four 1-byte flags: two devices x two phases


def moments(x):
    x = x[np.isfinite(x)]
    return [len(x), x.mean(), ((x - x.mean()) ** 2).sum(), x.min(), x.max()]


def test_running_totals_and_split_steps_match_numpy():
    torch.manual_seed(0)
    cfg = StatsConfig(nbins=4, lo=-1, hi=1)
    store = StateStore(cfg)
    key = TargetKey("fc", Kind.OUTPUT)
    st, flag = store.resolve(key, "cpu", "train")
    x1 = torch.randn(1000, dtype=torch.float64) * 3 + 1
    x2 = torch.randn(333, dtype=torch.float64) - 2
    x2[5] = math.nan
    store.accumulate(x1, st, flag)
    store.split_steps()  # the open step apart from the steps before it
    store.accumulate(x2, st, flag)
    f, i = StateStore.to_host([st])[id(st)]
    np.testing.assert_allclose(f, moments(np.concatenate([x1.numpy(), x2.numpy()])), rtol=1e-12)
    np.testing.assert_allclose(st.fstate.numpy(), moments(x2.numpy()), rtol=1e-12)  # the open step alone
    assert i[0] == 1333  # count: every value, NaN too
    store.reset()
    f, i = StateStore.to_host([st])[id(st)]
    assert f[:3].tolist() == [0, 0, 0] and np.isnan(f[3:]).all() and not i.any()


def test_an_unsampled_flag_leaves_the_state_untouched():
    store = StateStore(StatsConfig())
    st, flag = store.resolve(TargetKey("fc", Kind.OUTPUT), "cpu", "train")
    store.set_modes((0, 1))
    store.accumulate(torch.ones(10), st, flag)
    assert not st.istate.any() and st.fstate[0].item() == 0
    store.set_modes((1, 1))
    store.accumulate(torch.ones(10), st, flag)
    assert st.istate[0].item() == 10 and st.fstate[:2].tolist() == [10.0, 1.0]


def test_every_read_and_write_of_the_states_outside_the_op_is_ordered_first(monkeypatch):
    """Torch ops on the states (step ends, host reads, resets, checkpoints, reduce) run on the current stream; on
    CUDA the op may have updated a state from another stream, so each of those first orders the states
    (accumulate.order_states, csrc/cuda/stream_order.h). Recorded here on CPU, where ordering itself is a no-op."""
    import torch.nn as nn
    import hookstats
    from hookstats import accumulate
    ordered = []
    real = accumulate.order_states

    def record(fstates):
        fstates = list(fstates)
        ordered.append({id(f) for f in fstates})
        real(fstates)
    monkeypatch.setattr(accumulate, "order_states", record)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    mon = hookstats.attach(model, history=True, log_every=2)
    for _ in range(3):
        model(torch.randn(3, 4)).sum().backward()
    every = {id(st.fstate) for _, _, st in mon.states()}
    assert every and any(every <= o for o in ordered), "the step ends (history) order every state"
    for action in (mon.stats, mon.state_dict, mon.reset):
        ordered.clear()
        action()
        assert any(every <= o for o in ordered), f"{action.__name__} reads or writes the states unordered"
    mon.remove()
