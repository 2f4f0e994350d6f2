#!/usr/bin/env bash
# On a machine with a GPU: builds the extension once per set of kernel tuning constants (in parallel, each in
# its own copy of the tree) and runs the bandwidth sweep and graph latency of each, one after the other, so
# the variants are compared in one run (benchmarks/results/gpu_tune_h100.log came from this).
#   bash benchmarks/gpu_tune.sh                       # the variants below
#   bash benchmarks/gpu_tune.sh "mi1=-DHS_MIN_ITERS=1" "base="
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || set -- "base=" "mi4=-DHS_MIN_ITERS=4" "mi2=-DHS_MIN_ITERS=2" "u4=-DHS_UNROLL=4"
arch=$(python3 -c "import torch; p = torch.cuda.get_device_capability(); print(f'{p[0]}.{p[1]}')")
for v in "$@"; do
  name=${v%%=*} flags=${v#*=} dir=/tmp/hookstats-tune-${v%%=*}
  rm -rf "$dir" && mkdir -p "$dir" && git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$dir"
  (cd "$dir" && HOOKSTATS_NVCC_FLAGS="$flags" HOOKSTATS_FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST="$arch" MAX_JOBS=4 \
     python3 setup.py -q build_ext --inplace > build.log 2>&1; echo "built $name ($flags): exit $?") &
done
wait
for v in "$@"; do
  echo "== ${v%%=*} (${v#*=})"
  PYTHONPATH=/tmp/hookstats-tune-${v%%=*} python3 benchmarks/gpu_check.py --sweep-only --quick | grep -v "^device"
done
