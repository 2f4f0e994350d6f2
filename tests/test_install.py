"""Installing hookstats: a plain `pip install <clone>` into a fresh venv that has torch compiles the op on first
import; the wheel and sdist built without torch carry the sources; a build that cannot happen falls back to the
reference path with the reason and the fix; a failed build is not redone at every import."""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile

import numpy as np
import pytest
import torch
from helpers import cpu_kernels

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIP = ["-m", "pip", "install", "--disable-pip-version-check", "-q"]


def run(cmd, timeout=900, **kw):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    assert out.returncode == 0, f"{cmd}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def copy_of_the_checkout(dest):
    """The tracked and new (unignored) files, without build outputs such as hookstats/_C.so."""
    files = run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT).stdout.split("\0")
    os.makedirs(dest)
    for f in filter(None, files):
        if os.path.isfile(os.path.join(ROOT, f)):
            os.makedirs(os.path.join(dest, os.path.dirname(f)), exist_ok=True)
            shutil.copyfile(os.path.join(ROOT, f), os.path.join(dest, f))
    return dest


# Imports hookstats without the worktree's _C (the editable install's finder would find it) and prints what
# the op measured of a tensor, with the tensor itself, for the float64 oracle below.
PROBE = """
import json, sys
{hide}
import torch, hookstats
from hookstats import accumulate
x = torch.randn(3000, generator=torch.Generator().manual_seed(0)) * 3
fs = torch.tensor([0, 0, 0, float("nan"), float("nan")], dtype=torch.float64)
cfg = hookstats.StatsConfig()
ist = torch.zeros(cfg.istate_size, dtype=torch.int64)
accumulate.accumulate_(x, fs, ist, torch.zeros(0, dtype=torch.uint8), torch.tensor([True]), cfg.op_params())
kernel = torch.ops.hookstats.cpu_kernel() if hookstats.backend() == "compiled" else None
print(json.dumps({{"backend": hookstats.backend(), "kernel": kernel, "file": hookstats.__file__,
                  "fstate": fs.tolist(), "x": x.double().tolist()}}))
"""


def check_probe(stdout):
    got = json.loads(stdout.strip().splitlines()[-1])
    x = np.array(got["x"], dtype=np.float64)
    count, mean, m2, lo, hi = got["fstate"]
    assert count == x.size and lo == x.min() and hi == x.max()
    assert abs(mean - x.mean()) < 1e-6 * x.std() and abs(m2 - ((x - x.mean()) ** 2).sum()) < 1e-5 * m2
    return got


@pytest.mark.slow  # a fresh venv, torch installed into it and the op compiled: minutes
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fresh venv's build is checked on Linux")
def test_plain_pip_install_in_a_fresh_venv_compiles_the_op_on_first_import(tmp_path):
    """`pip install torch==<ours>` then `pip install <clone>` with no flags (build isolation, no torch in it):
    two processes import at once, one compiles, both get the op; a third loads the cached build."""
    src = copy_of_the_checkout(str(tmp_path / "src"))
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    py = str(venv / "bin" / "python")
    run([py, *PIP, f"torch=={torch.__version__.split('+')[0]}"])
    run([py, *PIP, src])
    site = run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    assert not glob.glob(os.path.join(site, "hookstats", "_C*")), "the isolated build made an extension"
    assert os.path.isfile(os.path.join(site, "hookstats", "_csrc", "cpu", "accumulate_cpu.cpp"))

    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), "PYTHONPATH": ""}
    env.pop("HOOKSTATS_BACKEND", None)
    probe = [py, "-W", "always", "-c", PROBE.format(hide="")]
    both = [subprocess.Popen(probe, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             cwd=str(tmp_path)) for _ in range(2)]
    outs = [p.communicate(timeout=1200) for p in both]
    for p, (out, err) in zip(both, outs):
        assert p.returncode == 0, err[-3000:]
        got = check_probe(out)
        assert got["backend"] == "compiled" and got["file"].startswith(site)
        assert got["kernel"] == cpu_kernels()[-1]
        assert "Warning" not in err, err
    said = [line for _, err in outs for line in err.splitlines() if "compiling the fused op" in line]
    assert len(said) == 1, said  # one process built, the other waited for it

    (folder,) = glob.glob(str(tmp_path / "ext" / "hookstats-*"))
    ninja = open(os.path.join(folder, "build.ninja")).read()
    cflags = re.search(r"^cflags = (.*)$", ninja, re.M).group(1).split()
    for flag in ("-O3", "-fopenmp", "-ffp-contract=off", "-DNDEBUG"):
        assert flag in cflags, (flag, cflags)
    assert "-fopenmp" in re.search(r"^ldflags = (.*)$", ninja, re.M).group(1).split()
    built = sorted(os.path.basename(s) for s in re.findall(r"^build \S+: compile (\S+)", ninja, re.M))
    cpu_sources = [s for s in glob.glob(os.path.join(ROOT, "csrc", "**", "*.cpp"), recursive=True)
                   if os.sep + "cuda" + os.sep not in s]  # csrc/cuda/ (its launcher too) only in CUDA builds
    assert built == sorted(os.path.basename(s) for s in cpu_sources)

    again = run(probe, env=env, cwd=str(tmp_path))
    assert check_probe(again.stdout)["backend"] == "compiled" and "compiling" not in again.stderr


def probe_without_extension(tmp_path, **env):
    """This venv's hookstats with its _C hidden, so the gate goes to the build on first import."""
    env = {**{k: v for k, v in os.environ.items() if k != "HOOKSTATS_BACKEND"},
           "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), **env}
    code = PROBE.format(hide="sys.modules['hookstats._C'] = None")
    return subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=300)


def test_no_compiler_falls_back_to_the_reference_with_the_reason_and_the_fix(tmp_path):
    out = probe_without_extension(tmp_path, CXX="/nonexistent/c++")
    assert out.returncode == 0 and check_probe(out.stdout)["backend"] == "reference"
    assert out.stderr.count("RuntimeWarning") == 1, out.stderr
    assert "no C++ compiler ('/nonexistent/c++' is not on PATH)" in out.stderr
    assert "apt-get install g++" in out.stderr and "HOOKSTATS_BACKEND=reference" in out.stderr
    assert "circular import" not in out.stderr


def test_backend_compiled_is_an_error_when_the_op_cannot_be_built(tmp_path):
    out = probe_without_extension(tmp_path, CXX="/nonexistent/c++", HOOKSTATS_BACKEND="compiled")
    assert out.returncode != 0
    assert "ImportError: HOOKSTATS_BACKEND=compiled" in out.stderr and "no C++ compiler" in out.stderr


def test_a_failed_build_falls_back_and_is_not_redone_at_every_import(tmp_path):
    broken = tmp_path / "cxx"
    broken.write_text("#!/bin/sh\necho 'error: this compiler is broken' >&2\nexit 1\n")
    broken.chmod(0o755)
    first = probe_without_extension(tmp_path, CXX=str(broken))
    assert "compiling the fused op" in first.stderr and "building it failed" in first.stderr, first.stderr
    second = probe_without_extension(tmp_path, CXX=str(broken))
    assert "compiling the fused op" not in second.stderr and "its build failed before" in second.stderr
    for out in (first, second):
        assert out.returncode == 0 and check_probe(out.stdout)["backend"] == "reference"
        assert out.stderr.count("RuntimeWarning") == 1


def build_without_torch(tmp_path, what):
    """setup.py as pip's isolated build runs it: torch is hidden, so no extension is built."""
    src = copy_of_the_checkout(str(tmp_path / "src"))
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None\n")
    out = run([sys.executable, "setup.py", "-q", what, "-d", str(tmp_path / "dist")], cwd=src,
              env={**os.environ, "PYTHONPATH": str(hide)}, timeout=300)
    assert "torch is not importable in this build environment" in out.stderr
    (made,) = glob.glob(str(tmp_path / "dist" / "*"))
    return made


def test_the_wheel_built_without_torch_is_pure_python_and_carries_the_sources(tmp_path):
    wheel = build_without_torch(tmp_path, "bdist_wheel")
    assert wheel.endswith("-py3-none-any.whl")
    names = zipfile.ZipFile(wheel).namelist()
    csrc = {os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "csrc", "**", "*"), recursive=True)
            if os.path.isfile(p)}
    assert {n.replace("hookstats/_csrc/", "csrc/") for n in names if n.startswith("hookstats/_csrc/")} == csrc
    assert "hookstats/_build.py" in names and not [n for n in names if n.endswith(".so")]


def test_the_sdist_carries_the_sources(tmp_path):
    sdist = build_without_torch(tmp_path, "sdist")
    names = {n.split("/", 1)[1] for n in tarfile.open(sdist).getnames() if "/" in n}
    for f in ("csrc/ops.cpp", "csrc/cpu/accumulate_cpu.cpp", "csrc/accumulator.h", "setup.py", "hookstats/_build.py"):
        assert f in names, f
    assert not [n for n in names if n.endswith(".so")]


def test_a_build_killed_midway_does_not_make_later_imports_wait_forever(tmp_path):
    """cpp_extension's lock file outlives a process killed while it builds; the next import builds anyway."""
    broken = tmp_path / "cxx"
    broken.write_text("#!/bin/sh\nexit 1\n")
    broken.chmod(0o755)
    probe_without_extension(tmp_path, CXX=str(broken))
    (folder,) = glob.glob(str(tmp_path / "ext" / "hookstats-*"))
    os.remove(os.path.join(folder, "FAILED"))
    open(os.path.join(folder, "lock"), "w").close()  # what a killed build leaves
    out = probe_without_extension(tmp_path, CXX=str(broken))  # times out (300 s) if it waits on the lock
    assert "compiling the fused op" in out.stderr and "building it failed" in out.stderr, out.stderr


def test_the_installed_ecosystem_imports():
    """scripts/install.sh leaves no package that fails to import: torchvision, when present, is one built for this
    torch and fastai's vision API imports; fastai, lightning and transformers import either way (a torchvision
    that cannot load breaks the last two). PyPI has no torchvision for the CPU torch 2.13.0: README, install.sh."""
    import importlib.util
    code = "import fastai.callback.hook, lightning, transformers\n"
    if importlib.util.find_spec("torchvision") is not None:
        code += "import torchvision\nfrom fastai.vision.all import *\n"
    run([sys.executable, "-c", code], timeout=300)


@pytest.mark.parametrize("force, torch_cuda, cuda_home, want", [
    (None, "13.0", "/usr/local/cuda", True), (None, "13.0", None, False), (None, None, "/usr/local/cuda", False),
    ("1", None, None, True), ("0", "12.1", "/usr/local/cuda", False)])
def test_the_ahead_of_time_build_takes_cuda_when_torch_and_nvcc_have_it_or_as_forced(monkeypatch, force, torch_cuda,
                                                                                   cuda_home, want):
    # HOOKSTATS_FORCE_CUDA=0: a CUDA torch whose CUDA differs from nvcc's still builds its CPU kernel. The recipe is
    # loaded from its file, as setup.py loads it.
    import importlib.util
    from types import SimpleNamespace

    spec = importlib.util.spec_from_file_location("hookstats_build", os.path.join(ROOT, "hookstats", "_build.py"))
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    if force is None:
        monkeypatch.delenv("HOOKSTATS_FORCE_CUDA", raising=False)
    else:
        monkeypatch.setenv("HOOKSTATS_FORCE_CUDA", force)
    fake_torch = SimpleNamespace(version=SimpleNamespace(cuda=torch_cuda))
    assert recipe.ahead_of_time_cuda(fake_torch, cuda_home) is want
