"""The extension's build recipe, shared by its two builds: setup.py's ahead-of-time build (it loads this file
by path, before torch may be importable) and the build on first import with torch.utils.cpp_extension.load,
for installs whose wheel was built without torch (a plain `pip install .`, an sdist, HOOKSTATS_NO_EXT=1).
Both compile the same sources with the same flags; torch is imported only inside functions.
"""
import contextlib
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig

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
    # cuda/: the kernels (*.cu, nvcc) and their ATen launcher (*.cpp, the C++ compiler: no nvcc pass over torch's headers)
    cuda_files = sorted(glob.glob(os.path.join(root, "cuda", "*.cu")) + glob.glob(os.path.join(root, "cuda", "*.cpp")))
    return found + (cuda_files if cuda else [])


def cxx_flags():
    # at::parallel_for is an OpenMP pragma in ATen's headers: without -fopenmp the CPU kernel runs on one
    # thread. The libgomp.so.1 that torch has already loaded is the one the extension then uses.
    # No -std: torch adds the one its headers need (2.14: C++20). The AVX2 kernel needs no flag: its header
    # compiles itself for AVX2 and the CPU is checked at run time.
    return ["-O3", "-g0", "-ffp-contract=off"] + openmp_flags()


def first_use_cflags():
    """The AOT build's flags plus those setuptools adds from Python's own build flags that change the code."""
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
    """xformers' rule: CUDA when torch has CUDA and nvcc is found, or HOOKSTATS_FORCE_CUDA=1; HOOKSTATS_FORCE_CUDA=0
    builds the CPU kernel alone (a CUDA torch whose CUDA version differs from nvcc's)."""
    force = os.environ.get("HOOKSTATS_FORCE_CUDA")
    if force in ("0", "1"):
        return force == "1"
    return bool(torch.version.cuda and cuda_home)


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


@contextlib.contextmanager
def _build_env(cuda_home, arch):
    """The environment of the build only: this Python's scripts folder on PATH (pip's ninja lies there even
    when the venv is not activated), CUDA_HOME and TORCH_CUDA_ARCH_LIST. cpp_extension reads CUDA_HOME once,
    when first imported, and may have guessed it from a wrapper nvcc: it gets the real toolkit here too."""
    values = {"PATH": sysconfig.get_path("scripts") + os.pathsep + os.environ.get("PATH", "")}
    values.update({k: v for k, v in (("CUDA_HOME", cuda_home), ("TORCH_CUDA_ARCH_LIST", arch)) if v})
    from unittest import mock  # here: it imports asyncio, a tenth of a second of every `hookstats report`
    with mock.patch.dict(os.environ, values):
        import torch.utils.cpp_extension as cpp_extension
        with mock.patch.object(cpp_extension, "CUDA_HOME", cuda_home) if arch else contextlib.nullcontext():
            yield


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


def _compile(root, arch, folder):
    from torch.utils.cpp_extension import load
    what = f"CPU and CUDA ({arch})" if arch else "CPU"
    print(f"hookstats: compiling the fused op ({what}) for this torch, once: a few minutes; cached in {folder}",
          file=sys.stderr, flush=True)
    load(NAME, sources(root, cuda=arch is not None), extra_cflags=first_use_cflags(), extra_cuda_cflags=nvcc_flags(),
         extra_ldflags=openmp_flags(), extra_include_paths=[root] + (cuda_include_dirs() if arch else []),
         build_directory=folder, with_cuda=arch is not None, is_python_module=False)


def _raise_if_failed_before(folder):
    if os.path.exists(os.path.join(folder, FAILED)):
        with open(os.path.join(folder, FAILED)) as f:
            raise NotBuilt(f"its build failed before: {f.readline().strip()}",
                           f"fix the cause, then delete {folder} and import again")


def load_on_first_use():
    """Loads the op, compiling it into the cache first if needed; raises NotBuilt(reason, fix)."""
    import torch
    root = source_dir()
    if root is None:
        raise NotBuilt("this install has neither hookstats/_C nor the C++ sources to build it",
                       "reinstall from a clone or an sdist")
    cuda_home = find_cuda_home()
    arch = first_use_cuda_arch(torch, cuda_home)
    with _build_env(cuda_home, arch):
        key = _cache_key(torch, sources(root, arch is not None), root, arch, cuda_home)
        folder = os.path.join(build_root(), f"hookstats-{key}")
        if not os.path.exists(os.path.join(folder, BUILT)):
            _build(torch, root, arch, folder)
        torch.ops.load_library(os.path.join(folder, NAME + ".so"))


def _build(torch, root, arch, folder):
    _raise_if_failed_before(folder)
    os.makedirs(folder, exist_ok=True)
    with _lock(folder):
        if os.path.exists(os.path.join(folder, BUILT)):  # another process built it while this one waited
            return
        _raise_if_failed_before(folder)
        _check_tools()
        try:
            _compile(root, arch, folder)
        except (RuntimeError, subprocess.SubprocessError) as e:  # the compiler's check or its build failed
            lines = [ln for ln in str(e).splitlines() if ln.strip()]
            reason = " / ".join(lines[-3:])[-600:].rstrip(".") or type(e).__name__
            failed = os.path.join(folder, FAILED)
            with open(failed, "w") as f:  # the whole output; and later imports don't compile again
                f.write(f"{reason}\n\n{e}")
            raise NotBuilt(f"building it failed: {reason}",
                           f"see the compiler's output in {failed}, fix the cause and delete {folder}") from e
        with open(os.path.join(folder, BUILT), "w") as f:
            f.write(torch.__version__)
