"""The reference fallback: chosen by HOOKSTATS_BACKEND or a missing extension, with one clear warning."""
import os
import subprocess
import sys

import numpy as np
import torch
from torch import nn

import hookstats

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def python(code, **env):
    out = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, **env}, timeout=120)
    assert out.returncode == 0, out.stderr
    return out


def test_env_forces_the_reference_path():
    out = python("import hookstats; print(hookstats.backend())", HOOKSTATS_BACKEND="reference")
    assert out.stdout.strip() == "reference" and "Warning" not in out.stderr


def test_missing_extension_warns_once_with_the_build_command_and_still_works():
    code = ("import sys; sys.modules['hookstats._C'] = None\n"
            "import torch, hookstats\n"
            "m = torch.nn.Linear(3, 3)\n"
            "with hookstats.attach(m) as mon: m(torch.randn(2, 3)); m(torch.randn(2, 3))\n"
            "print(hookstats.backend(), mon.stats()['Linear:output']['count'])")
    out = python(code, CXX="/nonexistent/c++")  # and no compiler to build it on first import
    assert out.stdout.split() == ["reference", "12"]
    assert out.stderr.count("RuntimeWarning") == 1
    assert "no C++ compiler" in out.stderr and "apt-get install g++" in out.stderr


def test_a_bad_backend_name_is_an_error():
    out = subprocess.run([sys.executable, "-c", "import hookstats"], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "HOOKSTATS_BACKEND": "cuda"}, timeout=120)
    assert out.returncode != 0 and "HOOKSTATS_BACKEND must be" in out.stderr


def test_reference_and_compiled_monitors_agree(monkeypatch):
    from hookstats import accumulate, reference
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 8))
    x = torch.randn(256, 16)
    results = []
    for impl in (torch.ops.hookstats.accumulate_.default, reference.accumulate_):
        monkeypatch.setattr(accumulate, "accumulate_", impl)
        with hookstats.attach(model) as mon:
            for _ in range(3):
                model(x)
        results.append(mon.stats(kind="output"))
    a, b = results
    assert a.keys() == b.keys()
    for k in a:
        for stat in ("count", "finite", "near_zero_count", "nan", "min", "max"):
            assert a[k][stat] == b[k][stat], (k, stat)
        np.testing.assert_array_equal(a[k]["hist"], b[k]["hist"])
        np.testing.assert_array_equal(a[k]["float_hist"], b[k]["float_hist"])  # the default histogram
        np.testing.assert_array_equal(a[k]["log2_hist"], b[k]["log2_hist"])
        assert a[k]["mean"] == np.float64(b[k]["mean"]) or abs(a[k]["mean"] - b[k]["mean"]) < 1e-7 * b[k]["std"]
        assert abs(a[k]["std"] - b[k]["std"]) < 1e-6 * b[k]["std"]
