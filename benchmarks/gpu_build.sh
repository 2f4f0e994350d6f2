#!/usr/bin/env bash
# On a machine with a GPU: builds hookstats' CPU+CUDA extension in place against the python3 that holds a
# CUDA torch (no venv, no download), for this GPU's architecture only, and says what loaded.
# Then: python3 benchmarks/gpu_check.py; python3 -m hookstats bench --device cuda; python3 -m hookstats demo.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"
arch=$("$py" -c "import torch; p = torch.cuda.get_device_capability(); print(f'{p[0]}.{p[1]}')")
start=$(date +%s)
HOOKSTATS_FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-$arch}" MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
  "$py" setup.py -q build_ext --inplace
echo "gpu_build: built for sm_${arch/./} in $(( $(date +%s) - start )) s"
"$py" -c "import torch, hookstats; print('gpu_build: torch', torch.__version__, 'on', torch.cuda.get_device_name(),
      '| backend', hookstats.backend(), '| CUDA kernel', hookstats.accumulate.has_cuda_kernel())"
