#!/usr/bin/env bash
# CI job: builds the full CUDA extension out of tree against torch 2.14.1+cu130 (no GPU needed), checks that
# it loads, registers the CUDA kernels and passes torch.library.opcheck on CPU tensors, builds it again the way
# a plain `pip install .` does on first import (hookstats/_build.py) and checks the CUDA kernel is in, then prints
# the ptxas register/spill table. The venv is cached outside the clone; the checkout's hookstats/_C.so is untouched.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${HOOKSTATS_CUDA_VENV:-$HOME/.cache/hookstats/cuda-venv}"
build="${HOOKSTATS_CUDA_BUILD:-${TMPDIR:-/tmp}/hookstats-cuda-build}"

if [ -z "${CUDA_HOME:-}" ]; then  # the nvcc on PATH may be a wrapper script: find the nvcc it execs
  nvcc=$(command -v nvcc) || { echo "cuda_build: nvcc not found; set CUDA_HOME" >&2; exit 1; }
  real=$(grep -ao '/[^ "]*/bin/nvcc' "$nvcc" | head -1 || true)
  CUDA_HOME=$(dirname "$(dirname "${real:-$(readlink -f "$nvcc")}")")
fi
export CUDA_HOME
echo "cuda_build: CUDA_HOME=$CUDA_HOME venv=$venv build=$build"

[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
if ! "$venv/bin/python" -c "import torch, sys; sys.exit(torch.__version__ != '2.14.1+cu130')" 2>/dev/null; then
  "$venv/bin/pip" install --disable-pip-version-check -q torch==2.14.1 ninja pybind11 setuptools wheel numpy
fi

# A copy of the tracked (and new, unignored) files: the in-place build writes only into the copy.
rm -rf "$build" && mkdir -p "$build"
git ls-files -z -co --exclude-standard | xargs -0 cp --parents -t "$build"
cd "$build"
start=$(date +%s)
HOOKSTATS_FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-8.0;9.0}" MAX_JOBS="${MAX_JOBS:-2}" \
  "$venv/bin/python" setup.py -q build_ext --inplace
echo "cuda_build: extension built in $(( $(date +%s) - start )) s: $(du -h hookstats/_C.so | cut -f1)"

"$venv/bin/python" - <<'PY'
import torch
import hookstats
from hookstats import StatsConfig

assert hookstats.backend() == "compiled", hookstats.backend()
for op in ("accumulate_", "accumulate_many_"):
    for key in ("CPU", "CUDA"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"hookstats::{op}", key), (op, key)
assert torch._C._dispatch_has_kernel("hookstats::cuda_scratch_bytes")  # schema in ops.cpp, catch-all kernel in cuda/accumulate_cuda.cpp
cfg = StatsConfig()
x = torch.randn(1000)
args = lambda: (torch.tensor([0, 0, 0, float("nan"), float("nan")], dtype=torch.float64),
                torch.zeros(cfg.istate_size, dtype=torch.int64), torch.zeros(0, dtype=torch.uint8))
f, i, s = args()
torch.library.opcheck(torch.ops.hookstats.accumulate_.default, (x, f, i, s, torch.tensor([True]), cfg.op_params()))
states = [args() for _ in range(2)]
torch.library.opcheck(torch.ops.hookstats.accumulate_many_.default,
                      ([x, x[:10]], [t[0] for t in states], [t[1] for t in states], [t[2] for t in states],
                       torch.tensor([True]), cfg.op_params()))
print(f"cuda_build: torch {torch.__version__} (CUDA {torch.version.cuda}); CPU+CUDA kernels registered; opcheck ok")
PY

# The build on first import (what a plain `pip install .` gets) from the same sources: with a CUDA torch, nvcc and
# TORCH_CUDA_ARCH_LIST (no GPU here), it must compile and register the CUDA kernel too.
start=$(date +%s)
TORCH_EXTENSIONS_DIR="$build/ext" TORCH_CUDA_ARCH_LIST="${HOOKSTATS_JIT_ARCH:-9.0}" MAX_JOBS="${MAX_JOBS:-2}" \
  "$venv/bin/python" - <<'PY'
import sys
sys.modules["hookstats._C"] = None  # the in-place build above: leave it aside
import torch
import hookstats
assert hookstats.backend() == "compiled", hookstats.backend()
import os
assert os.path.dirname(hookstats.__file__) == os.path.abspath("hookstats"), hookstats.__file__
for key in ("CPU", "CUDA"):
    assert torch._C._dispatch_has_kernel_for_dispatch_key("hookstats::accumulate_", key), key
print("cuda_build: built on first import: CPU+CUDA kernels registered")
PY
echo "cuda_build: first-import build took $(( $(date +%s) - start )) s"
cd - > /dev/null
python3 tests/test_ptxas.py
