"""The error of the float buckets' quantiles (hookstats/buckets.py) against NumPy's exact ones (inverted_cdf), on
smooth and spiky data, for the interpolated estimate and the bucket midpoint it replaced (2ab / (a + b), computed
here from the bucket holding the exact value). Without and with the exact min/max (stats() has them, history rows
do not). Writes benchmarks/results/quantile_error.json.
    PYTHONPATH=. python benchmarks/quantile_error.py"""
import json
import pathlib
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))
from float_oracle import float_counts  # noqa: E402

from hookstats import buckets  # noqa: E402
from hookstats.tools import bench  # noqa: E402

Q = np.array([0.001, 0.01, 0.5, 0.99, 0.999])
N = 100_000


def datasets(rng):
    return {"normal": rng.standard_normal(N), "lognormal(0, 2)": rng.lognormal(0, 2, N),
            "uniform(-1, 3)": rng.uniform(-1, 3, N), "relu(normal)": np.maximum(rng.standard_normal(N), 0),
            "layernorm-like (normal, 768 wide rows)": (lambda x: (x - x.mean(1, keepdims=True)) / x.std(1, keepdims=True))(
                rng.standard_normal((N // 768 + 1, 768)) * 3 + 1).ravel()[:N],
            "point masses": rng.choice([0.3, 1.7, -2.5, 40.0], N),
            "normal + 5 huge outliers": np.concatenate([rng.standard_normal(N - 5), [1e30, -3e35, 2e37, 5e20, 1e38]]),
            "all equal (0.7)": np.full(N, 0.7)}


def midpoint(x):
    """The estimate the buckets gave before: 2ab / (a + b) of the log-linear bucket [a, b) holding x (normal
    float32 magnitudes; 0 exact)."""
    m = np.abs(x)
    fr, e = np.frexp(m)  # m = fr * 2**e, fr in [0.5, 1)
    a = np.floor(fr * 16) / 16 * np.exp2(e)
    b = a + np.exp2(e - 4.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        est = np.where(m == 0, 0.0, 2 * a * b / (a + b))
    return np.sign(x) * est


def main():
    rng = np.random.default_rng(0)
    rows = []
    for name, x in datasets(rng).items():
        x = x.astype(np.float32).astype(np.float64)
        counts = float_counts(torch.from_numpy(x))
        for absolute in (False, True):
            v = np.abs(x) if absolute else x
            true = np.quantile(v, Q, method="inverted_cdf")
            scale = np.maximum(np.abs(true), 1e-300)
            for known in (False, True):
                mm = dict(minimum=x.min(), maximum=x.max()) if known else {}
                est = buckets.quantiles(counts, Q, absolute=absolute, **mm)
                old = midpoint(true)
                if known:  # the midpoint estimator had the exact ends too
                    old = np.where(np.arange(len(Q)) == 0, true, old) if Q[0] * N <= 1 else old
                rows.append({"data": name, "of": "|x|" if absolute else "x", "min_max_known": known,
                             "q": Q.tolist(), "interpolated_rel_err": (np.abs(est - true) / scale).tolist(),
                             "midpoint_rel_err": (np.abs(old - true) / scale).tolist()})
    smooth = [r for r in rows if r["data"] in ("normal", "lognormal(0, 2)", "uniform(-1, 3)", "relu(normal)",
                                               "layernorm-like (normal, 768 wide rows)")]

    def summary(rs, key):
        # p1/p50/p99 (the ranks inside the data; the extreme ones are exact with min/max known)
        e = np.array([r[key][1:4] for r in rs if not r["min_max_known"]]).ravel()
        e = e[np.isfinite(e)]
        return {"median": float(np.median(e)), "max": float(e.max())}

    out = {"machine": bench.machine(), "command": "PYTHONPATH=. python benchmarks/quantile_error.py",
           "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
           "n": N, "bound": {"rel": buckets.QUANTILE_REL_ERROR, "abs": buckets.QUANTILE_ABS_ERROR},
           "smooth_p1_p50_p99": {"interpolated": summary(smooth, "interpolated_rel_err"),
                                 "midpoint": summary(smooth, "midpoint_rel_err")},
           "rows": rows}
    for r in rows:
        if not r["min_max_known"]:
            print(f"{r['data']:40s} {r['of']:3s} interp {np.array2string(np.array(r['interpolated_rel_err']), precision=4)}"
                  f"  midpoint {np.array2string(np.array(r['midpoint_rel_err']), precision=4)}")
    print("smooth data, p1/p50/p99:", out["smooth_p1_p50_p99"])
    path = pathlib.Path(__file__).parent / "results" / "quantile_error.json"
    path.write_text(json.dumps(out, indent=1))
    print("wrote", path)


if __name__ == "__main__":
    main()
