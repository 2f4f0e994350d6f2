"""hookstats/rawstate.py on its own: combine() of the states of random splits of data (NaN/Inf and parts without a
finite value among them), in any grouping and order, gives the state a float64 NumPy oracle computes from the whole
data; empty() is combine()'s identity; NumPy and torch agree bit for bit; the table tiles the state."""
import math

import numpy as np
import pytest
import torch

from hookstats import layout, rawstate

ISIZE = 6  # a small istate: every istate field merges by SUM, so its size does not matter here


def oracle_state(v, rng):
    """(fstate, istate) of float64 values v by the definitions, in NumPy: n, mean and M2 of the finite values, min
    and max of them (NaN when there are none: n, mean and M2 then 0), and random counts standing in for the istate."""
    fin = v[np.isfinite(v)]
    if fin.size:
        mean = fin.mean()
        with np.errstate(over="ignore"):  # M2 past float64's range is inf
            f = np.array([fin.size, mean, ((fin - mean) ** 2).sum(), fin.min(), fin.max()])
    else:
        f = np.array([0.0, 0.0, 0.0, math.nan, math.nan])  # the oracle's own empty state, written out
    return f, rng.integers(0, 1000, ISIZE)


def data(rng, kind):
    n = int(rng.integers(0, 400))
    v = rng.normal(size=n) * 10.0 ** rng.integers(-3, 4)
    if kind == "nonfinite":
        v[rng.random(n) < 0.2] = np.nan
        v[rng.random(n) < 0.1] = np.inf
        v[rng.random(n) < 0.1] = -np.inf
    elif kind == "offset":
        v += 1e6
    return v


def split(v, rng, k):
    """k parts of v at random cut points; some parts are empty, and one may hold only NaN/Inf."""
    cuts = np.sort(rng.integers(0, len(v) + 1, k - 1))
    parts = np.split(v, cuts)
    if k > 2 and rng.random() < 0.5:
        parts.insert(int(rng.integers(0, k)), np.array([np.nan, np.inf, -np.inf]))
    return parts


def assert_state_close(got, want):
    (f, i), (wf, wi) = got, want
    f = np.asarray(f)
    assert f[rawstate.N_FINITE] == wf[0]
    assert np.array_equal(f[[rawstate.MIN, rawstate.MAX]], wf[3:], equal_nan=True)
    spread = math.sqrt(wf[2] / wf[0]) if wf[0] else 0.0
    assert abs(f[rawstate.MEAN] - wf[1]) <= 1e-12 * (abs(wf[1]) + spread), (f, wf)
    # the merge's d = mean_b - mean_a carries the means' rounding (|mean| * 2**-52): M2's error scales with it
    assert abs(f[rawstate.M2] - wf[2]) <= 1e-10 * wf[2] + 1e-14 * wf[0] * abs(wf[1]) * spread + 1e-300, (f, wf)
    assert np.array_equal(np.asarray(i), wi)


def tree_combine(states, rng):
    """combine() of states in their order, grouped at random: ((a b) (c d)) e, a (b (c d)), ..."""
    if len(states) == 1:
        return states[0]
    k = int(rng.integers(1, len(states)))
    return rawstate.combine(tree_combine(states[:k], rng), tree_combine(states[k:], rng))


@pytest.mark.parametrize("kind", ["normal", "nonfinite", "offset"])
@pytest.mark.parametrize("seed", range(12))
def test_combine_of_random_splits_equals_the_oracle_of_the_whole(seed, kind):
    rng = np.random.default_rng(seed)
    v = data(rng, kind)
    whole = oracle_state(v, rng)
    for k in (1, 2, 3, 7):
        parts = split(v, rng, k)
        states = [oracle_state(p, rng) for p in parts]
        want = (whole[0], sum(s[1] for s in states))
        assert_state_close(rawstate.combine_all(states), want)  # in order
        assert_state_close(tree_combine(states, rng), want)  # associative: any grouping
        shuffled = [states[j] for j in rng.permutation(len(states))]
        assert_state_close(rawstate.combine_all(shuffled), want)  # commutative, up to rounding
        got = tree_combine([tuple(torch.from_numpy(a) for a in s) for s in states], rng)
        assert_state_close(tuple(t.numpy() for t in got), want)


def test_numpy_and_torch_give_the_same_bits():
    rng = np.random.default_rng(5)
    states = [oracle_state(data(rng, kind), rng) for kind in ("nonfinite", "normal", "offset", "normal")]
    states.append(rawstate.empty(ISIZE, numpy=True))
    for a in states:
        for b in states:
            n = rawstate.combine(a, b)
            t = rawstate.combine(tuple(torch.from_numpy(x) for x in a), tuple(torch.from_numpy(x) for x in b))
            assert np.array_equal(n[0], t[0].numpy(), equal_nan=True) and np.array_equal(n[1], t[1].numpy())


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_empty_is_the_identity_bit_for_bit(lib):
    rng = np.random.default_rng(2)
    states = [oracle_state(data(rng, kind), rng) for kind in ("normal", "nonfinite", "offset")]
    states += [oracle_state(np.array([np.nan, np.inf]), rng), oracle_state(np.array([-0.0]), rng),
               oracle_state(np.array([1e300, -1e300]), rng)]  # M2 inf: still passed through untouched
    for s in states:
        if lib == "torch":
            s, e = tuple(torch.from_numpy(x) for x in s), rawstate.empty(ISIZE)
        else:
            e = rawstate.empty(ISIZE, numpy=True)
        for got in (rawstate.combine(e, s), rawstate.combine(s, e)):
            assert np.array_equal(np.asarray(got[0]), np.asarray(s[0]), equal_nan=True)
            assert np.array_equal(np.asarray(got[1]), np.asarray(s[1]))
    e = rawstate.empty(ISIZE, numpy=True) if lib == "numpy" else rawstate.empty(ISIZE)
    both = rawstate.combine(e, e)
    assert np.array_equal(np.asarray(both[0]), oracle_state(np.array([]), rng)[0], equal_nan=True)


def test_rows_of_many_states_combine_row_by_row():
    """[..., F] rows (the history ring's [T, F], a leading step axis) combine as each row alone."""
    rng = np.random.default_rng(3)
    a = np.stack([oracle_state(data(rng, "nonfinite"), rng)[0] for _ in range(12)]).reshape(3, 4, -1)
    b = np.stack([oracle_state(data(rng, "normal"), rng)[0] for _ in range(12)]).reshape(3, 4, -1)
    b[0, 0] = rawstate.empty(numpy=True)
    rows = rawstate.combine(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    for j in np.ndindex(3, 4):
        assert np.array_equal(rows[j], rawstate.combine(a[j], b[j]), equal_nan=True)
    assert np.array_equal(rawstate.combine(a, b), rows, equal_nan=True)


def test_combine_leaves_its_inputs_alone():
    rng = np.random.default_rng(4)
    a, b = (tuple(torch.from_numpy(x) for x in oracle_state(data(rng, "normal"), rng)) for _ in range(2))
    copies = [t.clone() for t in a + b]
    rawstate.combine(a, b)
    assert all(torch.equal(t, c) for t, c in zip(a + b, copies))


def test_empty_shapes_dtypes_and_devices():
    f, i = rawstate.empty(9, shape=(2, 3), device="meta")
    assert (f.shape, f.dtype, f.device.type, i.shape, i.dtype) == ((2, 3, 5), torch.float64, "meta", (2, 3, 9),
                                                                  torch.int64)
    f, i = rawstate.empty(9, shape=(2,), numpy=True)
    assert f.shape == (2, 5) and f.dtype == np.float64 and f.flags.writeable and i.shape == (2, 9)
    f[0, 0] = 1.0  # its own memory: the other row stays empty
    assert f[1, 0] == 0.0
    assert rawstate.empty().shape == (5,)


@pytest.mark.parametrize("nbins", [1, 7, 40, 256])
@pytest.mark.parametrize("flags", range(16))
def test_the_fields_tile_the_state(flags, nbins):
    """The fstate fields cover 0..F-1 once each; the istate fields the flags keep cover the istate once each, the
    per-step (GROWTH) ones first: a history ring keeps that prefix."""
    for part, size in ((rawstate.FSTATE, rawstate.FSTATE_SIZE), (rawstate.ISTATE, layout.istate_size(nbins, flags))):
        spans = sorted(fd.slots(nbins, flags) for fd in rawstate.FIELDS if fd.part == part)
        spans = [(start, n) for start, n in spans if n]
        assert [s for s, _ in spans] == [0] + list(np.cumsum([n for _, n in spans])[:-1]), spans
        assert sum(n for _, n in spans) == size
    growth = [rawstate.slots(fd.name, nbins, flags) for fd in rawstate.FIELDS if fd.step == rawstate.GROWTH]
    assert max(s.stop for s in growth) == rawstate.step_slots(nbins, flags) == layout.float_base(nbins, flags)
    assert all(fd.merge == rawstate.SUM for fd in rawstate.FIELDS if fd.part == rawstate.ISTATE)
