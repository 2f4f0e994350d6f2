"""hookstats/buckets.py against NumPy on the raw values: bucket counts from tests/float_oracle.py, truths from the
values themselves (numpy.quantile, direct shares, np.histogram)."""
import numpy as np
import pytest
import torch
from float_oracle import ABOVE, BELOW, HALF, SLOTS, ZERO, float_counts, float_slots
from helpers import bin_values

from hookstats import buckets, layout

Q_GRID = np.unique(np.concatenate([buckets.DEFAULT_QUANTILES, np.linspace(0, 1, 41), [1e-4, 0.3333, 0.9999]]))


def _signs(rng, n, p_neg=0.5):
    return np.where(rng.random(n) < p_neg, -1.0, 1.0)


def _datasets():
    rng = np.random.default_rng(1234)
    n = 20000
    sub = rng.uniform(0, 2.0 ** -126, n).astype(np.float32) * _signs(rng, n).astype(np.float32)
    lognormal20 = np.exp(rng.uniform(-23, 23, n)) * _signs(rng, n)  # 20 decades
    mixture = np.concatenate([np.exp(rng.normal(0, 3, n // 2)), -1e3 * np.abs(rng.standard_normal(n // 4)),
                              rng.standard_normal(n // 4) * 1e-4])
    heavy_zeros = np.where(rng.random(n) < 0.9, 0.0, rng.standard_normal(n))
    edges = np.array([2.0 ** e for e in range(-30, 20)] + [448.0, 57344.0, 65504.0, 1.125, -1.25, 2.0 ** -133, 0.0])
    return {
        "normal_f32": rng.standard_normal(n).astype(np.float32),
        "lognormal_20_decades": lognormal20.astype(np.float32),
        "sign_mixture": mixture.astype(np.float32),
        "heavy_zeros": heavy_zeros.astype(np.float32),
        "subnormals": np.concatenate([sub, rng.standard_normal(n // 10).astype(np.float32) * 1e-38]),
        "bf16_rounded": torch.randn(n, dtype=torch.bfloat16).float().numpy() * np.float32(3.0),
        "fp16": (rng.standard_normal(n) * 1e3).astype(np.float16),
        "relu_like": np.maximum(rng.standard_normal(n), 0).astype(np.float32),
        "all_negative": -np.exp(rng.normal(0, 5, n)).astype(np.float32),
        "bucket_edges_and_formats": np.concatenate([edges, -edges, edges * 1.0625]).astype(np.float32),
        "float64_beyond_float32": np.concatenate([rng.standard_normal(n // 2),
                                                  np.exp(rng.uniform(-800, 700, n // 2)) * _signs(rng, n // 2)]),
        "grad_1e-6": (rng.standard_normal(n) * 1e-6).astype(np.float32),
        "grad_1e4": (rng.standard_t(3, n) * 1e4).astype(np.float32),
        "tiny_n": np.array([3.5, -0.25, 0.0], dtype=np.float32),
        "single": np.array([-7.0], dtype=np.float32),
        "with_nonfinite": np.array([np.nan, np.inf, -np.inf, 1.0, -2.0, 0.0, 1e-3], dtype=np.float32),
    }


DATA = _datasets()


def _finite64(x):
    v = np.asarray(x).astype(np.float64).reshape(-1)
    return v[np.isfinite(v)]


@pytest.fixture(params=sorted(DATA), ids=str)
def data(request):
    return DATA[request.param]


# --- the oracle itself ------------------------------------------------------------------------------------

def test_oracle_constants_match_the_layout():
    assert (HALF, SLOTS) == (layout.FLOAT_HALF, layout.FLOAT_SLOTS)
    assert (BELOW, ABOVE, ZERO) == (layout.FLOAT_BELOW, layout.FLOAT_ABOVE, layout.FLOAT_ZERO)


def test_oracle_slots_of_known_values():
    v = np.array([1.0, 1.125, 1.1249, -1.0, 2.0 ** -149, 2.0 ** -127, 2.0 ** -126, 0.0, -0.0, np.nan, np.inf])
    want = [1016, 1017, 1016, HALF + 1016, 0, 4, 8, ZERO, ZERO, -1, -1]
    assert float_slots(v.astype(np.float32)).tolist() == want
    assert float_slots(v).tolist() == want
    assert float_slots(np.array([1e-300, -1e-300, 1e300, -1e300, 3.4028235e38])).tolist() == \
        [BELOW, HALF + BELOW, ABOVE, HALF + ABOVE, 2039]
    # float64 is binned by its exact magnitude (truncation), not by its float32 rounding
    assert float_slots(np.array([np.nextafter(2.0, 0.0)])).tolist() == [1023]


def test_oracle_float64_path_equals_the_bits_path_on_float32_values(data):
    with np.errstate(over="ignore"):
        f = np.asarray(data).astype(np.float32)
    assert np.array_equal(float_slots(f), float_slots(f.astype(np.float64)))
    assert np.array_equal(float_slots(torch.from_numpy(f).bfloat16()), float_slots(torch.from_numpy(f).bfloat16()
                                                                                    .float().numpy()))


def test_oracle_counts_merge_by_addition(data):
    half = len(data) // 2
    assert np.array_equal(float_counts(data), float_counts(data[:half]) + float_counts(data[half:]))


# --- log2 histogram ---------------------------------------------------------------------------------------

def _today_log2(x, dtype):
    """The kernels' log2 histogram: slot of each finite value after bin_value (helpers.bin_values)."""
    v = np.asarray(x).astype(np.float64).reshape(-1)
    b = np.abs(bin_values(v[np.isfinite(v)], dtype).astype(np.float64))
    _, e = np.frexp(b)
    slots = np.where(b == 0, 0, np.where(b < 2.0 ** -126, 1, e - 1 - layout.LOG_EXP_MIN + 2))
    return np.bincount(slots, minlength=layout.LOG_SLOTS)


def test_log2_hist_equals_todays_log2_histogram(data):
    dtype = torch.float64 if np.asarray(data).dtype == np.float64 else torch.float32
    assert np.array_equal(buckets.log2_hist(float_counts(data)), _today_log2(data, dtype))


def test_log2_hist_of_float64_is_by_exact_magnitude():
    x = np.array([np.nextafter(2.0, 0.0), np.nextafter(2.0 ** -126, 0.0)])  # round up to 2 and 2**-126 in float32
    h = buckets.log2_hist(float_counts(x))
    assert h[1] == 1 and h[2 + 1 - layout.LOG_EXP_MIN - 1] == 1
    assert not np.array_equal(h, _today_log2(x, torch.float64))


# --- shares per format ------------------------------------------------------------------------------------

def test_format_constants_are_torchs():
    dts = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8 e4m3": torch.float8_e4m3fn,
           "fp8 e5m2": torch.float8_e5m2}
    for name, (sub, normal, mx) in buckets.FORMATS.items():
        fi = torch.finfo(dts[name])
        assert (sub, normal, mx) == (fi.smallest_normal * fi.eps, fi.smallest_normal, fi.max)


def test_dtype_shares_bound_the_true_shares_and_are_exact_at_bucket_edges(data):
    v = _finite64(data)
    a = np.abs(v)
    got = buckets.dtype_shares(float_counts(data))
    for name, (sub, normal, mx) in buckets.FORMATS.items():
        true = {"underflow": ((a > 0) & (a < sub)).mean(), "subnormal": ((a >= sub) & (a < normal)).mean(),
                "overflow": (a >= mx).mean()}
        for key, t in true.items():
            lo, hi = got[name][key], got[name][key + "_upper"]
            assert lo <= t <= hi, (name, key)
            if buckets.EXACT_SHARES[name][key]:
                assert lo == hi == t, (name, key)


def test_which_shares_are_exact():
    e = buckets.EXACT_SHARES
    assert all(e["fp8 e4m3"].values()) and all(e["fp8 e5m2"].values())
    assert e["fp16"] == {"underflow": True, "subnormal": True, "overflow": False}
    assert not any(e["bf16"].values())


def test_dtype_shares_are_at_least_the_log2_chart_shares(data):
    from hookstats.tools.plots import range_shares
    old = range_shares(_today_log2(data, torch.float32 if np.asarray(data).dtype != np.float64 else torch.float64))
    new = buckets.dtype_shares(float_counts(data))
    for name in buckets.FORMATS:
        assert new[name]["overflow_upper"] >= old[name]["overflow"]
        assert new[name]["underflow_upper"] >= old[name]["underflow"]


def test_fp8_overflow_counts_values_at_the_max():
    got = buckets.dtype_shares(float_counts(np.array([448.0, 447.9, 480.0, 1.0], dtype=np.float32)))["fp8 e4m3"]
    assert got["overflow"] == got["overflow_upper"] == 0.5


# --- quantiles --------------------------------------------------------------------------------------------

def _assert_within_bound(est, true):
    err = np.abs(est - true)
    bound = np.maximum(buckets.QUANTILE_REL_ERROR * np.abs(true), buckets.QUANTILE_ABS_ERROR) * (1 + 1e-12)
    ok = (err <= bound) | (np.abs(true) >= 2.0 ** 128)
    assert ok.all(), (est[~ok], true[~ok])
    assert np.array_equal(est[true == 0], true[true == 0])  # zero is exact


@pytest.mark.parametrize("absolute", [False, True], ids=["x", "abs"])
@pytest.mark.parametrize("known", [False, True], ids=["buckets", "with_min_max"])
def test_quantiles_within_the_stated_bound_of_numpy(data, absolute, known):
    v = _finite64(data)
    ref = np.abs(v) if absolute else v
    true = np.quantile(ref, Q_GRID, method="inverted_cdf")
    kw = {"minimum": v.min(), "maximum": v.max()} if known else {}
    est = buckets.quantiles(float_counts(data), Q_GRID, absolute=absolute, **kw)
    assert est.shape == Q_GRID.shape
    _assert_within_bound(est, true)
    if known:
        assert np.all(est <= ref.max()) and est[-1] == ref.max()
        if not absolute or v.min() > 0 or v.max() < 0 or (v == 0).any():  # else min |x| is not known
            assert np.all(est >= ref.min()) and est[0] == ref.min()


def _random_mixture(seed):
    """Random scales, signs, zeros, ties (integers), bf16 rounding and sizes from 1 to 5000."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 5000))
    parts = [rng.standard_normal(n) * 10.0 ** rng.uniform(-40, 35),
             np.exp(rng.normal(rng.uniform(-60, 60), rng.uniform(0.1, 15), n)) * _signs(rng, n, rng.random()),
             np.zeros(n), rng.integers(-5, 6, n).astype(np.float64) * 2.0 ** rng.integers(-140, 100)]
    x = np.choose(rng.integers(0, 4, n), parts)
    if seed % 3 == 0:
        return torch.from_numpy(x).float().bfloat16().float().numpy()
    with np.errstate(over="ignore"):  # beyond float32: +-Inf, left out of the buckets
        return x.astype(np.float32) if seed % 3 == 1 else x


@pytest.mark.parametrize("seed", range(40))
def test_quantiles_within_the_stated_bound_on_random_mixtures(seed):
    x = _random_mixture(seed)
    v = _finite64(x)
    c = float_counts(x)
    for absolute in (False, True):
        ref = np.abs(v) if absolute else v
        true = np.quantile(ref, Q_GRID, method="inverted_cdf")
        _assert_within_bound(buckets.quantiles(c, Q_GRID, absolute=absolute), true)
        _assert_within_bound(buckets.quantiles(c, Q_GRID, absolute=absolute, minimum=v.min(), maximum=v.max()), true)


def test_quantile_bound_is_nearly_reached():
    """The estimator is no better than stated: data at a bucket's lower edge is 1/17 off, so the bound is tight."""
    x = np.full(10, 1.0, dtype=np.float32)
    est = buckets.quantiles(float_counts(x), [0.5])
    assert est[0] == pytest.approx((9 / 8) ** 0.45, rel=1e-12)  # rank 5 of 10 in [1, 9/8): f = 0.45, log-linear
    assert buckets.quantiles(float_counts(x), [0.5], minimum=1.0, maximum=1.0)[0] == 1.0


def test_quantiles_of_the_rank_rule_at_exact_products():
    x = np.arange(1, 1001, dtype=np.float32) * np.float32(1024)  # n * q integral at q = 0.001, 0.5, 0.999
    q = [0.001, 0.5, 0.999, 0.0015]
    true = np.quantile(x.astype(np.float64), q, method="inverted_cdf")
    _assert_within_bound(buckets.quantiles(float_counts(x), q), true)


def test_quantiles_of_rows_with_counts_near_int64_limits():
    """Totals near 2**61 per row: the rank search splits the rows so no lifted count overflows."""
    rows = np.zeros((5, SLOTS), dtype=np.int64)
    big = 2 ** 60
    for i in range(5):
        rows[i, [1016, 1016 + 8 * (i + 1), HALF + 1000]] = [big, big // (i + 1), 3 * big // 4]
    whole = buckets.quantiles(rows, [0.1, 0.5, 0.9])
    for i in range(5):
        assert np.array_equal(whole[i], buckets.quantiles(rows[i], [0.1, 0.5, 0.9]))
    n = rows[0].sum()
    assert whole[0, 0] < 0 and 1.0 <= whole[0, 1] < 1.125  # 1.0's bucket
    assert rows[0, HALF + 1000] < n / 2 < rows[0, HALF + 1000] + rows[0, 1016]


def test_quantiles_of_empty_rows_are_nan():
    assert np.isnan(buckets.quantiles(np.zeros(SLOTS, dtype=np.int64))).all()
    assert np.isnan(buckets.quantiles(float_counts(np.array([np.nan, np.inf])), absolute=True)).all()


# --- near zero --------------------------------------------------------------------------------------------

def test_near_zero_is_exact_at_every_edge(data):
    a = np.abs(_finite64(data))
    c = float_counts(data)
    ts = [0.0, 2.0 ** -149] + [2.0 ** e for e in range(-129, 129, 3)] + [2.0 ** 128, 3 * 2.0 ** -129, 1.375 * 2.0 ** -3]
    got = buckets.near_zero(np.broadcast_to(c, (len(ts), SLOTS)), np.array(ts))
    want = np.array([(a < t).sum() for t in ts]) / a.size
    assert np.array_equal(got, want)


@pytest.mark.parametrize("t", [1e-6, 3.1, 2.0 ** -140, -1.0, 2.0 ** 129])
def test_near_zero_rejects_a_threshold_that_is_not_a_bucket_edge(t):
    with pytest.raises(ValueError, match="not a bucket edge"):
        buckets.near_zero(float_counts(DATA["normal_f32"]), t)


def test_relative_near_zero_is_exact_relative_to_the_p99_binade(data):
    a = np.abs(_finite64(data))
    p99 = np.quantile(a, buckets.NEAR_ZERO_SCALE_Q, method="inverted_cdf")
    got = buckets.relative_near_zero(float_counts(data))
    if p99 == 0:
        assert got["threshold"] == 0 and got["share"] == (a == 0).mean()
        return
    _, e = np.frexp(min(p99, 2.0 ** 128))  # float64 beyond float32: E = 128
    t = 2.0 ** (e - 1 - buckets.NEAR_ZERO_BELOW_LOG2)
    if t >= 2.0 ** -126:
        assert got["threshold"] == t
    assert got["threshold"] <= t
    assert got["share"] == (a < got["threshold"]).mean() if got["threshold"] > 0 else (a == 0).mean()


def test_relative_near_zero_says_something_where_a_fixed_eps_does_not():
    rng = np.random.default_rng(5)
    out = rng.standard_normal(100000).astype(np.float32)
    grad = out * np.float32(1e-7)
    relu = np.maximum(out, 0)
    fixed = buckets.near_zero(np.stack([float_counts(out), float_counts(grad)]), 2.0 ** -20)  # ~1e-6
    rel = buckets.relative_near_zero(np.stack([float_counts(out), float_counts(grad), float_counts(relu)]))
    assert fixed[0] < 1e-5 and fixed[1] > 0.9
    assert 0.0005 < rel["share"][0] < 0.005 and 0.0005 < rel["share"][1] < 0.005
    zeros = (relu == 0).mean()
    assert zeros < rel["share"][2] < zeros + 0.005


# --- linear view ------------------------------------------------------------------------------------------

def _straddling(x, edge_values):
    """Count of the values sharing a float bucket with each edge: what the uniform split may misplace."""
    s = float_slots(x)
    counts = np.bincount(s[s >= 0], minlength=SLOTS)
    return counts[float_slots(np.asarray(edge_values, dtype=np.float64))]


@pytest.mark.parametrize("nbins", [1, 7, 64])
def test_linear_view_preserves_the_total_and_is_close_to_np_histogram(data, nbins):
    v = _finite64(data)
    view = buckets.linear_view(float_counts(data), nbins)
    edges, counts = view["edges"], view["counts"]
    assert edges.shape == (nbins + 1,) and counts.dtype == np.int64 and np.all(np.diff(edges) > 0)
    assert counts.sum() == v.size and np.all(counts >= 0)
    if not v.size:
        return
    true = np.histogram(np.clip(v, edges[0], edges[-1]), edges)[0]
    slack = _straddling(data, edges)
    assert np.all(np.abs(counts - true) <= slack[:-1] + slack[1:] + 1)
    assert abs(view["below"] - (v < edges[0]).sum()) <= slack[0] + 1
    assert abs(view["above"] - (v > edges[-1]).sum()) <= slack[-1] + 1


@pytest.mark.parametrize("name", ["grad_1e-6", "grad_1e4", "normal_f32", "lognormal_20_decades", "heavy_zeros"])
def test_linear_view_of_gradients_is_never_one_bin(name):
    x = DATA[name]
    v = _finite64(x)
    for kw in ({}, {"minimum": v.min(), "maximum": v.max()}):
        counts = buckets.linear_view(float_counts(x), 64, **kw)["counts"]
        assert counts.max() < 0.5 * counts.sum() or name in ("heavy_zeros", "lognormal_20_decades")
        assert (counts > 0).sum() >= 8


def test_linear_view_on_a_given_span_shared_by_rows():
    rows = np.stack([float_counts(DATA[k]) for k in ("normal_f32", "sign_mixture", "relu_like")])
    view = buckets.linear_view(rows, 10, span=(-2.0, 3.0))
    assert np.array_equal(view["edges"], np.broadcast_to(np.linspace(-2.0, 3.0, 11), (3, 11)))
    for i, k in enumerate(("normal_f32", "sign_mixture", "relu_like")):
        v = _finite64(DATA[k])
        true = np.histogram(np.clip(v, -2.0, 3.0), view["edges"][i])[0]
        slack = _straddling(DATA[k], view["edges"][i])
        assert view["counts"][i].sum() == v.size
        assert np.all(np.abs(view["counts"][i] - true) <= slack[:-1] + slack[1:] + 1)
    with pytest.raises(ValueError, match="span must be"):
        buckets.linear_view(rows, 10, span=(1.0, 1.0))


def test_linear_view_of_degenerate_rows():
    rows = np.stack([np.zeros(SLOTS, dtype=np.int64), float_counts(np.zeros(5, np.float32)),
                     float_counts(np.full(5, 3.0, np.float32))])
    view = buckets.linear_view(rows, 4, minimum=[np.nan, 0.0, 3.0], maximum=[np.nan, 0.0, 3.0])
    assert view["edges"][0].tolist() == [-1.0, -0.5, 0.0, 0.5, 1.0] and view["counts"][0].tolist() == [0] * 4
    assert view["edges"][1].tolist() == [-1.0, -0.5, 0.0, 0.5, 1.0] and view["counts"][1].tolist() == [0, 0, 5, 0]
    assert view["edges"][2][0] < 3.0 < view["edges"][2][-1] and view["counts"][2].sum() == 5


# --- shapes and errors ------------------------------------------------------------------------------------

def test_leading_dimensions_equal_row_by_row():
    names = ["normal_f32", "sign_mixture", "heavy_zeros", "subnormals", "tiny_n", "single"]
    rows = np.stack([float_counts(DATA[k]) for k in names]).reshape(2, 3, SLOTS)
    lo = np.array([_finite64(DATA[k]).min() for k in names]).reshape(2, 3)
    hi = np.array([_finite64(DATA[k]).max() for k in names]).reshape(2, 3)
    whole = buckets.quantiles(rows, absolute=True, minimum=lo, maximum=hi)
    view = buckets.linear_view(rows, 16, minimum=lo, maximum=hi)
    shares = buckets.dtype_shares(rows)
    assert whole.shape == (2, 3, 5) and view["counts"].shape == (2, 3, 16) and view["below"].shape == (2, 3)
    assert buckets.log2_hist(rows).shape == (2, 3, layout.LOG_SLOTS)
    for i in range(2):
        for j in range(3):
            one = buckets.quantiles(rows[i, j], absolute=True, minimum=lo[i, j], maximum=hi[i, j])
            assert np.array_equal(whole[i, j], one)
            assert np.array_equal(view["counts"][i, j], buckets.linear_view(rows[i, j], 16, minimum=lo[i, j],
                                                                             maximum=hi[i, j])["counts"])
            assert shares["bf16"]["subnormal_upper"][i, j] == buckets.dtype_shares(rows[i, j])["bf16"][
                "subnormal_upper"]
            assert buckets.relative_near_zero(rows)["share"][i, j] == buckets.relative_near_zero(rows[i, j])["share"]


@pytest.mark.parametrize("bad, match", [(np.zeros(4095, np.int64), "4096 float buckets"),
                                        (np.zeros(SLOTS, np.float64), "integers"),
                                        (-float_counts(np.ones(3, np.float32)), ">= 0")])
def test_bad_counts_raise_one_clear_error(bad, match):
    for f in (buckets.log2_hist, buckets.quantiles, buckets.dtype_shares, buckets.linear_view,
              buckets.relative_near_zero):
        with pytest.raises(ValueError, match=match):
            f(bad)


def test_bad_arguments_raise_one_clear_error():
    c = float_counts(DATA["normal_f32"])
    with pytest.raises(ValueError, match="q must be quantiles"):
        buckets.quantiles(c, [0.5, 1.5])
    with pytest.raises(ValueError, match="nbins"):
        buckets.linear_view(c, 0)
    with pytest.raises(ValueError, match="two quantiles"):
        buckets.linear_view(c, 8, q=(0.9, 0.1))
    rows = np.stack([c, c])
    with pytest.raises(ValueError, match="minimum must be a number or broadcast to the counts' leading shape"):
        buckets.quantiles(rows, minimum=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="threshold must be"):
        buckets.near_zero(rows, [1.0, 2.0, 4.0])
