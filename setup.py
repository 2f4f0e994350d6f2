# setup.py -- builds hookstats._C ahead of time when torch is importable here; everything else is in pyproject.toml.
# With torch (scripts/install.sh, `pip install --no-build-isolation .`): CUDA when torch has CUDA and nvcc is
# found, or HOOKSTATS_FORCE_CUDA=1 (xformers' rule). Without torch (a plain `pip install .`, whose isolated build
# environment has none) or with HOOKSTATS_NO_EXT=1: a pure-Python wheel carrying csrc/ as hookstats/_csrc/, and
# the op is compiled on first import (hookstats/_build.py holds the recipe both builds use).
import importlib.util
import os
import shutil
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("hookstats_build", os.path.join(ROOT, "hookstats", "_build.py"))
recipe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(recipe)


class BuildPyWithSources(build_py):
    """Ships csrc/ inside the package, for the build on first import."""

    def run(self):
        super().run()
        if self.editable_mode:  # an editable install builds from csrc/ itself
            return
        target = os.path.join(self.build_lib, "hookstats", "_csrc")
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(os.path.join(ROOT, "csrc"), target)


def extensions():
    if os.environ.get("HOOKSTATS_NO_EXT") == "1":
        print("hookstats: HOOKSTATS_NO_EXT=1: no ahead-of-time build; the op is compiled on first import "
              "(HOOKSTATS_BACKEND=reference at run time skips it)", file=sys.stderr)
        return [], {}
    if importlib.util.find_spec("torch") is None:
        print("hookstats: torch is not importable in this build environment (pip's build isolation): building a "
              "pure-Python wheel; the op is compiled on first import. To build it now instead, install torch "
              "first and use `pip install --no-build-isolation .`", file=sys.stderr)
        return [], {}
    cuda_home = recipe.find_cuda_home()
    if cuda_home:
        os.environ.setdefault("CUDA_HOME", cuda_home)
    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

    cuda = recipe.ahead_of_time_cuda(torch, cuda_home)
    sources = [os.path.relpath(s, ROOT) for s in recipe.sources(os.path.join(ROOT, "csrc"), cuda)]
    include = [os.path.join(ROOT, "csrc")]
    cxx, omp = recipe.cxx_flags(), recipe.openmp_flags()
    if cuda:
        ext = CUDAExtension("hookstats._C", sources, include_dirs=include + recipe.cuda_include_dirs(),
                            extra_compile_args={"cxx": cxx, "nvcc": recipe.nvcc_flags()}, extra_link_args=omp)
    else:
        ext = CppExtension("hookstats._C", sources, include_dirs=include, extra_compile_args={"cxx": cxx},
                           extra_link_args=omp)
    return [ext], {"build_ext": BuildExtension.with_options(no_python_abi_suffix=True)}


ext_modules, cmdclass = extensions()
setup(ext_modules=ext_modules, cmdclass={**cmdclass, "build_py": BuildPyWithSources})
