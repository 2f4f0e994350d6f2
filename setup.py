# setup.py -- builds hookstats._C with torch.utils.cpp_extension; everything else is in pyproject.toml.
# Build rule (xformers'): CUDA when torch has CUDA and nvcc is found, or HOOKSTATS_FORCE_CUDA=1;
# HOOKSTATS_NO_EXT=1 gives a pure-Python install that runs the reference path.
import glob
import os
import shutil
import sys

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))


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


def extensions():
    if os.environ.get("HOOKSTATS_NO_EXT") == "1":
        return [], {}
    cuda_home = find_cuda_home()
    if cuda_home:
        os.environ.setdefault("CUDA_HOME", cuda_home)
    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

    cuda = os.environ.get("HOOKSTATS_FORCE_CUDA") == "1" or (torch.version.cuda is not None and cuda_home)
    sources = ["csrc/ops.cpp"] + sorted(glob.glob("csrc/cpu/*.cpp"))
    cxx = ["-O3", "-g0", "-ffp-contract=off"]  # no -std: torch adds the one its headers need (2.14: C++20)
    # at::parallel_for is an OpenMP pragma in ATen's headers: without -fopenmp the CPU kernel runs on one
    # thread. The libgomp.so.1 that torch has already loaded is the one the extension then uses.
    omp = ["-fopenmp"] if sys.platform.startswith("linux") else []
    cxx += omp
    if cuda:
        sources += sorted(glob.glob("csrc/cuda/*.cu"))
        ext = CUDAExtension(
            "hookstats._C", sources, include_dirs=[os.path.join(ROOT, "csrc")] + cuda_include_dirs(),
            extra_compile_args={"cxx": cxx, "nvcc": nvcc_flags()}, extra_link_args=omp,
        )
    else:
        ext = CppExtension("hookstats._C", sources, include_dirs=[os.path.join(ROOT, "csrc")],
                           extra_compile_args={"cxx": cxx}, extra_link_args=omp)
    return [ext], {"build_ext": BuildExtension.with_options(no_python_abi_suffix=True)}


def nvcc_flags():
    # HOOKSTATS_NVCC_FLAGS: extra flags, e.g. the kernel's tuning constants (-DHS_MIN_ITERS=1) for experiments
    extra = os.environ.get("HOOKSTATS_NVCC_FLAGS", "").split()
    return ["-O3", "--expt-relaxed-constexpr", "-Xptxas=-warn-spills,-warn-lmem-usage"] + extra


def cuda_include_dirs():
    """The pip-assembled toolkit lacks some headers torch includes; the torch venv carries them."""
    import site
    dirs = []
    for sp in site.getsitepackages():
        d = os.path.join(sp, "nvidia", "cu13", "include")
        if os.path.isdir(d):
            dirs.append(d)
    return dirs


ext_modules, cmdclass = extensions()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
