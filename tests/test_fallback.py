"""The reference fallback: chosen by HOOKSTATS_BACKEND or a missing extension, with one clear warning."""
import glob
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

import hookstats

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def python(code, tmp_path, **env):
    """Runs code in a fresh Python with its own extensions folder: a build cached on this machine (by an earlier
    first import, in ~/.cache/torch_extensions or TORCH_EXTENSIONS_DIR) must not decide what the test sees."""
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "torch_extensions"), **env}
    out = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return out


def test_env_forces_the_reference_path(tmp_path):
    out = python("import hookstats; print(hookstats.backend())", tmp_path, HOOKSTATS_BACKEND="reference")
    assert out.stdout.strip() == "reference" and "Warning" not in out.stderr


def test_missing_extension_warns_once_with_the_build_command_and_still_works(tmp_path):
    code = ("import sys; sys.modules['hookstats._C'] = None\n"
            "import torch, hookstats\n"
            "m = torch.nn.Linear(3, 3)\n"
            "with hookstats.attach(m) as mon: m(torch.randn(2, 3)); m(torch.randn(2, 3))\n"
            "print(hookstats.backend(), mon.stats()['Linear:output']['count'])")
    out = python(code, tmp_path, CXX="/nonexistent/c++")  # and no compiler to build it on first import
    assert out.stdout.split() == ["reference", "12"]
    assert out.stderr.count("RuntimeWarning") == 1
    assert "no C++ compiler" in out.stderr and "apt-get install g++" in out.stderr


def test_a_bad_backend_name_is_an_error():
    """At the engine's first load (`import hookstats` loads it lazily: the first attach, or backend() here)."""
    out = subprocess.run([sys.executable, "-c", "import hookstats; hookstats.backend()"], capture_output=True, text=True,
                         cwd=ROOT,
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


def plant_a_cached_build():
    """What a first import that compiled the op leaves in the extensions folder this process's environment names:
    the built op and its BUILT mark, in the build folder a first import without a compiler makes (and leaves)."""
    assert backend_without_extension_or_compiler() == "reference"
    (folder,) = glob.glob(os.path.join(os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(
        os.environ["HOME"], ".cache", "torch_extensions"), "hookstats-*"))
    (built,) = glob.glob(os.path.join(os.path.dirname(hookstats.__file__), "_C*.so"))
    shutil.copyfile(built, os.path.join(folder, "hookstats_C.so"))
    open(os.path.join(folder, "BUILT"), "w").close()


@pytest.mark.slow  # eight fresh interpreters, each importing torch
def test_the_fallback_test_ignores_a_build_cached_on_this_machine(tmp_path, monkeypatch):
    """A user's ~/.cache/torch_extensions (or TORCH_EXTENSIONS_DIR) holding a build from an earlier first import
    would serve the op despite the missing compiler: the fallback test uses its own extensions folder."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    for ext in (None, str(tmp_path / "ext")):
        if ext:
            monkeypatch.setenv("TORCH_EXTENSIONS_DIR", ext)
        plant_a_cached_build()
        assert backend_without_extension_or_compiler() == "compiled"  # the planted build is served
        (tmp_path / "test").mkdir(exist_ok=True)
        test_missing_extension_warns_once_with_the_build_command_and_still_works(tmp_path / "test")


def backend_without_extension_or_compiler():
    """In this process's environment as it is, without the hermetic extensions folder of python()."""
    code = "import sys; sys.modules['hookstats._C'] = None\nimport hookstats; print(hookstats.backend())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env={**os.environ, "CXX": "/nonexistent/c++"})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()
