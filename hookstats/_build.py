"""The extension's build recipe, shared by its two builds: setup.py's ahead-of-time build (it loads this file
by path, before torch may be importable) and the build on first import with torch.utils.cpp_extension.load,
for installs whose wheel was built without torch (a plain `pip install .`, an sdist, HOOKSTATS_NO_EXT=1).
Both compile the same sources with the same flags; torch is imported only inside functions.
"""
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = "hookstats_C"
BUILT, FAILED = "BUILT", "FAILED"  # written in a build folder when its build is done or has failed


def source_dir():
    """hookstats/_csrc/ in an installed wheel (setup.py copies csrc/ there), csrc/ in a clone or editable install."""
    for d in (os.path.join(HERE, "_csrc"), os.path.join(os.path.dirname(HERE), "csrc")):
        if os.path.isfile(os.path.join(d, "ops.cpp")):
            return d
    return None


def sources(root, cuda):
    found = [os.path.join(root, "ops.cpp")] + sorted(glob.glob(os.path.join(root, "cpu", "*.cpp")))
    return found + (sorted(glob.glob(os.path.join(root, "cuda", "*.cu"))) if cuda else [])


def cxx_flags():
    # at::parallel_for is an OpenMP pragma in ATen's headers: without -fopenmp the CPU kernel runs on one
    # thread. The libgomp.so.1 that torch has already loaded is the one the extension then uses.
    # No -std: torch adds the one its headers need (2.14: C++20). The AVX2 kernel needs no flag: its header
    # compiles itself for AVX2 and the CPU is checked at run time.
    return ["-O3", "-g0", "-ffp-contract=off"] + openmp_flags()


def first_use_cflags():
    """The AOT build's flags plus those setuptools adds from Python's own build flags that change the code."""
    import sysconfig
    python = [f for f in (sysconfig.get_config_var("CFLAGS") or "").split() if f in ("-DNDEBUG", "-fwrapv")]
    return python + cxx_flags()


def openmp_flags():
    return ["-fopenmp"] if sys.platform.startswith("linux") else []


def nvcc_flags():
    # HOOKSTATS_NVCC_FLAGS: extra flags, e.g. the kernel's tuning constants (-DHS_MIN_ITERS=1) for experiments
    extra = os.environ.get("HOOKSTATS_NVCC_FLAGS", "").split()
    return ["-O3", "--expt-relaxed-constexpr", "-Xptxas=-warn-spills,-warn-lmem-usage"] + extra


def find_cuda_home():
    """The real toolkit root: the nvcc on PATH may be a wrapper script in a generic bin folder."""
    if os.environ.get("CUDA_HOME"):
        return os.environ["CUDA_HOME"]
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    with open(nvcc, "rb") as f:
        head = f.read(4096)
    if head.startswith(b"#!"):  # a wrapper: find the nvcc it execs
        for word in head.decode(errors="ignore").split():
            if word.endswith("/bin/nvcc") and os.path.exists(word):
                return os.path.dirname(os.path.dirname(word))
    return os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))


def cuda_include_dirs():
    """The pip-assembled toolkit lacks some headers torch includes; the torch venv carries them."""
    import site
    dirs = []
    for sp in site.getsitepackages():
        d = os.path.join(sp, "nvidia", "cu13", "include")
        if os.path.isdir(d):
            dirs.append(d)
    return dirs


def ahead_of_time_cuda(torch, cuda_home):
    """xformers' rule: CUDA when torch has CUDA and nvcc is found, or HOOKSTATS_FORCE_CUDA=1."""
    return os.environ.get("HOOKSTATS_FORCE_CUDA") == "1" or bool(torch.version.cuda and cuda_home)


def first_use_cuda_arch(torch, cuda_home):
    """TORCH_CUDA_ARCH_LIST for the build on first import, or None for a CPU-only build.

    cpp_extension would pick the visible GPUs' architectures itself, but fails with no GPU visible; an
    explicit list also goes into the cache key, so another GPU gets its own build."""
    if not (torch.version.cuda and cuda_home):
        return None
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return os.environ["TORCH_CUDA_ARCH_LIST"]
    if not torch.cuda.is_available():
        return None
    supported = [int(a.split("_")[1]) for a in torch.cuda.get_arch_list() if a.startswith("sm_")]
    newest = max(((sm // 10, sm % 10) for sm in supported), default=(99, 9))
    caps = sorted({min(torch.cuda.get_device_capability(i), newest) for i in range(torch.cuda.device_count())})
    return ";".join(f"{a}.{b}" for a, b in caps) + "+PTX"


def _cache_key(torch, srcs, root, arch, cuda_home):
    h = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(root, "**", "*"), recursive=True)):
        if os.path.isfile(path):
            h.update(os.path.relpath(path, root).encode())
            with open(path, "rb") as f:
                h.update(hashlib.sha256(f.read()).digest())
    h.update(repr(([os.path.relpath(s, root) for s in srcs], first_use_cflags(), nvcc_flags(), arch, cuda_home,
                   torch.__version__, torch.version.cuda, sys.version_info[:2], sys.platform)).encode())
    return h.hexdigest()[:16]


def build_root():
    """Where builds are cached: TORCH_EXTENSIONS_DIR or torch's default (~/.cache/torch_extensions)."""
    from torch.utils.cpp_extension import get_default_build_root
    return os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()


class NotBuilt(Exception):
    """The op could not be built here; args: (reason, fix)."""


def _check_tools():
    from torch.utils.cpp_extension import is_ninja_available
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        raise NotBuilt(f"no C++ compiler ({cxx!r} is not on PATH)",
                       "install one (Debian/Ubuntu: apt-get install g++; or set CXX) and import again")
    if not is_ninja_available():
        raise NotBuilt("ninja is not on PATH", "pip install ninja")


class _Env:
    """Sets environment variables for the build only: the Python's own bin folder on PATH (ninja from
    pip lies there even when the venv is not activated) and CUDA_HOME / TORCH_CUDA_ARCH_LIST."""

    def __init__(self, **values):
        scripts = os.path.dirname(sys.executable)
        values["PATH"] = scripts + os.pathsep + os.environ.get("PATH", "")
        self.values = {k: v for k, v in values.items() if v is not None}

    def __enter__(self):
        self.saved = {k: os.environ.get(k) for k in self.values}
        os.environ.update(self.values)

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _lock(folder):
    """An OS lock the kernel drops when its holder dies, around cpp_extension's own lock file (a process
    killed mid-build leaves that file behind and every later import would wait on it forever): whoever holds
    this lock knows any lock file it finds is stale."""
    import fcntl
    f = open(os.path.join(folder, "hookstats.lock"), "w")
    fcntl.flock(f, fcntl.LOCK_EX)
    stale = os.path.join(folder, "lock")
    if os.path.exists(stale):
        os.remove(stale)
    return f


def _compile(torch, root, arch, cuda_home, folder):
    from torch.utils.cpp_extension import load
    what = f"CPU and CUDA ({arch})" if arch else "CPU"
    print(f"hookstats: compiling the fused op ({what}) for this torch, once: a few minutes; cached in {folder}",
          file=sys.stderr, flush=True)
    with _Env(CUDA_HOME=cuda_home, TORCH_CUDA_ARCH_LIST=arch):
        load(NAME, sources(root, cuda=arch is not None), extra_cflags=first_use_cflags(), extra_cuda_cflags=nvcc_flags(),
             extra_ldflags=openmp_flags(), extra_include_paths=[root] + (cuda_include_dirs() if arch else []),
             build_directory=folder, with_cuda=arch is not None, is_python_module=False)


def load_on_first_use():
    """Loads the op, compiling it into the cache first if needed; raises NotBuilt(reason, fix)."""
    import torch
    root = source_dir()
    if root is None:
        raise NotBuilt("this install has neither hookstats/_C nor the C++ sources to build it",
                       "reinstall from a clone or an sdist")
    cuda_home = find_cuda_home()
    arch = first_use_cuda_arch(torch, cuda_home)
    key = _cache_key(torch, sources(root, arch is not None), root, arch, cuda_home)
    folder = os.path.join(build_root(), f"hookstats-{key}")
    built, failed = os.path.join(folder, BUILT), os.path.join(folder, FAILED)
    if os.path.exists(built):  # the folder's key covers sources, flags and torch: load it as it is
        torch.ops.load_library(os.path.join(folder, NAME + ".so"))
        return
    if os.path.exists(failed):
        with open(failed) as f:
            raise NotBuilt(f"its build failed before: {f.read().strip()}",
                           f"fix the cause, then delete {folder} and import again")
    _check_tools()
    os.makedirs(folder, exist_ok=True)
    lock = _lock(folder)
    try:
        if not os.path.exists(built):  # else another process built it while this one waited for the lock
            try:
                _compile(torch, root, arch, cuda_home, folder)
            except (RuntimeError, subprocess.SubprocessError) as e:  # the compiler's check or its build failed
                lines = [ln for ln in str(e).splitlines() if ln.strip()]
                reason = " / ".join(lines[-3:])[-600:].rstrip(".") or type(e).__name__
                with open(failed, "w") as f:  # don't compile again at every import
                    f.write(reason)
                raise NotBuilt(f"building it failed: {reason}",
                               f"see the compiler output in {folder}, or build ahead of time with "
                               "`pip install --no-build-isolation .`") from e
            with open(built, "w") as f:
                f.write(torch.__version__)
            return
    finally:
        lock.close()
    torch.ops.load_library(os.path.join(folder, NAME + ".so"))
