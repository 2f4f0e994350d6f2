#!/usr/bin/env bash
# benchmarks/gpu_run.sh -- the GPU check of hookstats in one run of at most 8 minutes (--budget) on a fresh GPU
# machine whose python3 holds a CUDA torch, nvcc, compute-sanitizer and ncu (no venv, nothing downloaded):
#   0 nvidia-smi, kernel, gVisor          1 build in place for this GPU's arch only, all cores
#   2 correctness vs a float64 oracle computed on the GPU, invariants after every call
#   3 CUDA graphs                         4 compute-sanitizer memcheck and racecheck, hookstats' kernels only
#   5 bandwidth and latency in CUDA graphs against x.sum()      6 ncu on bf16 float buckets at 256 MB
#   7 training-step overhead and peak memory (GPT-2 small and the bench transformer, bf16 autocast), the planner
# Each step runs under its own timeout (its cap, or what the budget has left), its output teed to OUT/gpu_run.log
# as it goes; a failed step does not stop the run, which exits 0 after writing OUT/report.md and OUT/report.json
# (each step passed / failed / skipped and why, its figures, the performance targets beside them).
#
#   OUT=/path bash benchmarks/gpu_run.sh                       on the GPU machine (OUT: where results go)
#   bash benchmarks/gpu_run.sh --dry-run --out DIR             no GPU: every step's CPU-possible part, the report
#   PYTHON=.../cuda-venv/bin/python bash benchmarks/gpu_run.sh --dry-run --build --arch 9.0 --out DIR
#                                                              ... and the build for sm_90, in a copy of the tree
# Options: --out DIR (default $OUT, else benchmarks/results/gpu_run), --budget SECONDS (480), --arch X.Y (default:
# nvidia-smi's compute_cap), --skip-build (use the op already built here), --python PY (default $PYTHON or python3),
# --only STEP,STEP (these steps alone, e.g. --only 0-env,5-bandwidth), --build-timeout SECONDS (120: 16 cores),
# --cap-scale K (every step's cap but the build's times K: a rehearsal on a shared CPU, whose steps run the CPU op).
set -uo pipefail
self=$(readlink -f "$0")
repo=$(dirname "$(dirname "$self")")

# ---------------------------------------------------------------- one step's body (run under timeout)
if [ "${1:-}" = "--step" ]; then
  step=$2
  py=$GPU_RUN_PY out=$GPU_RUN_OUT tree=$GPU_RUN_TREE dry=$GPU_RUN_DRY
  report() { python3 "$repo/benchmarks/gpu_report.py" record "$out" "$@"; }
  pysteps() { PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}" "$py" -u "$repo/benchmarks/gpu_steps.py" "$@" --out "$out" \
                ${dry:+--dry-run}; }
  find_tool() {  # on PATH, beside nvcc, or in the CUDA torch's nvidia/cu13/bin
    command -v "$1" 2>/dev/null && return
    for d in "${CUDA_HOME:-/usr/local/cuda}/bin" /usr/local/cuda/bin \
             "$("$py" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "cu13", "bin"))' 2>/dev/null)"; do
      [ -x "$d/$1" ] && { echo "$d/$1"; return; }
    done
    return 1
  }
  case "$step" in
    0-env)
      nvidia-smi || echo "nvidia-smi: not available"
      uname -a
      cat /proc/version 2>/dev/null
      torch_line=$("$py" -c "import sys, torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name(), sys.version.split()[0])")
      echo "torch, CUDA, GPU, python: $torch_line"
      nvcc --version 2>/dev/null | tail -2 || echo "nvcc: not found"
      tools=""
      for t in compute-sanitizer ncu; do found=$(find_tool $t || echo "not found"); echo "$t: $found"; tools+="$t ${found##*/}; "; done
      # what the build and the steps need beyond torch: said here, before the build fails on it
      missing=$("$py" - <<'PY'
import importlib.metadata as md, importlib.util, os, shutil, sys, sysconfig
need = []
for mod in ("numpy", "setuptools", "ninja"):
    if importlib.util.find_spec(mod) is None:
        need.append(mod)
try:
    if int(md.version("setuptools").split(".")[0]) < 77:
        need.append(f"setuptools>=77 (has {md.version('setuptools')}: the build on first use is taken)")
except md.PackageNotFoundError:
    pass
if not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
    need.append("Python.h (the Python headers)")
if shutil.which("ninja") is None and not os.path.exists(os.path.join(sysconfig.get_path("scripts"), "ninja")):
    need.append("the ninja program")
print("; ".join(need) or "none")
PY
)
      echo "missing: $missing"
      report 0-env --figure "kernel=$(uname -r)" --figure "gvisor=$GPU_RUN_GVISOR" --figure "arch=$GPU_RUN_ARCH" \
        --figure "gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" \
        --figure "torch=$torch_line" --figure "cores=$(nproc)" --figure "tools=$tools" --figure "missing=$missing"
      ;;
    1-build)
      if [ -n "$dry" ] && [ -z "$GPU_RUN_BUILD" ]; then report 1-build --status skipped --reason "dry run (--build builds)"; exit 0; fi
      if [ -n "$GPU_RUN_SKIP_BUILD" ]; then report 1-build --status skipped --reason "--skip-build"; exit 0; fi
      cd "$tree" || exit 1
      start=$(date +%s)
      if ! HOOKSTATS_FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST="$GPU_RUN_ARCH" MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
        "$py" setup.py -q build_ext --inplace; then
        # setup.py needs setuptools >= 77 (pyproject's SPDX license); the build on first import does not
        echo "setup.py build_ext failed: the build on first import instead"
        TORCH_CUDA_ARCH_LIST="$GPU_RUN_ARCH" MAX_JOBS="${MAX_JOBS:-$(nproc)}" PYTHONPATH="$tree" \
          "$py" -c "import hookstats; print('first-use build:', hookstats.backend())" || exit 1
        : > "$out/first_use_build"  # the steps take that build (gpu_steps.py: never a build of their own)
        report 1-build --figure "build=first use (setup.py failed)"
      fi
      secs=$(( $(date +%s) - start ))
      PYTHONPATH="$tree" "$py" -c "
import torch, hookstats
assert hookstats.backend() == 'compiled', hookstats.backend()
assert torch._C._dispatch_has_kernel_for_dispatch_key('hookstats::accumulate_', 'CUDA'), 'no CUDA kernel registered'
print('build: CPU+CUDA kernels registered; torch', torch.__version__)" || exit 1
      report 1-build --figure "seconds=$secs" --figure "arch=$GPU_RUN_ARCH" --figure "so_bytes=$(stat -c %s "$tree/hookstats/_C.so" 2>/dev/null || echo first-use)"
      ;;
    2-correctness) pysteps correctness --name 2-correctness ;;
    3-graphs) pysteps graphs --name 3-graphs ;;
    4-memcheck|4-racecheck)
      tool=${step#4-}
      if [ -n "$dry" ]; then
        pysteps sanitize --name "$step" && report "$step" --reason "dry run: the workload alone, no compute-sanitizer"
        exit 0
      fi
      [ "$GPU_RUN_GVISOR" = 1 ] && { report "$step" --status skipped --reason "gVisor (no compute-sanitizer there)"; exit 0; }
      cs=$(find_tool compute-sanitizer) || { report "$step" --status skipped --reason "compute-sanitizer not found"; exit 0; }
      sanitize() {
        PYTHONPATH="$tree" "$cs" --tool "$tool" "$@" --error-exitcode 3 --print-limit 30 \
          "$py" -u "$repo/benchmarks/gpu_steps.py" sanitize --name "$step" --out "$out" 2>&1 | tee "$out/$step.log"
        return "${PIPESTATUS[0]}"
      }
      sanitize --kernel-name kns=hookstats; rc=$?
      if [ "$rc" != 0 ] && [ "$rc" != 3 ] && grep -qiE "unrecogni|invalid (value|option)|unknown option" "$out/$step.log"; then
        echo "compute-sanitizer refused the kernel filter: again on every kernel"
        sanitize; rc=$?
      fi
      summary=$(grep -E "(ERROR|RACECHECK) SUMMARY" "$out/$step.log" | tail -1)
      report "$step" --figure "summary=${summary:-none printed}" \
        $( [ "$rc" = 3 ] && echo --status failed --reason "compute-sanitizer found errors" )
      exit "$rc"
      ;;
    5-bandwidth) pysteps bandwidth --name 5-bandwidth ;;
    6-ncu)
      if [ -n "$dry" ]; then
        pysteps ncu-target --name 6-ncu && report 6-ncu --reason "dry run: the workload alone, no ncu"
        exit 0
      fi
      [ "$GPU_RUN_GVISOR" = 1 ] && { report 6-ncu --status skipped --reason "gVisor (no ncu there)"; exit 0; }
      ncu=$(find_tool ncu) || { report 6-ncu --status skipped --reason "ncu not found"; exit 0; }
      stalls=$(for r in long_scoreboard short_scoreboard lg_throttle mio_throttle math_pipe_throttle wait barrier \
                 not_selected selected dispatch_stall no_instruction membar branch_resolving drain sleeping tex_throttle; do
                 printf "smsp__average_warps_issue_stalled_%s_per_issue_active.ratio," "$r"; done)
      metrics="dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_atom.sum,gpu__time_duration.sum,${stalls%,}"
      profile() {
        PYTHONPATH="$tree" "$ncu" --clock-control none --kernel-name regex:dense_kernel --launch-count 2 "$@" --csv --page raw \
          "$py" -u "$repo/benchmarks/gpu_steps.py" ncu-target --name 6-ncu --out "$out" > "$out/ncu.csv" 2> "$out/ncu.err"
      }
      profile --metrics "$metrics"; rc=$?
      if [ "$rc" != 0 ] && grep -qiE "metric" "$out/ncu.err"; then  # a metric this ncu does not know: its sections
        echo "ncu refused a metric: again with its sections"
        profile --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis; rc=$?
      fi
      cat "$out/ncu.err" "$out/ncu.csv" | tail -40
      python3 "$repo/benchmarks/gpu_report.py" ncu "$out" 6-ncu "$out/ncu.csv"
      [ "$rc" = 0 ] || report 6-ncu --status failed --reason "ncu exit $rc: $(grep -m1 -E 'ERR|rror' "$out/ncu.err" | cut -c1-160)"
      exit "$rc"
      ;;
    7-train) pysteps train --name 7-train ;;
    7-bench)
      dev=cuda repeats=3 steps=10 workload=transformer
      [ -n "$dry" ] && dev=cpu repeats=1 steps=2 workload=stack4  # the command's path, on a model CPUs run quickly
      PYTHONPATH="$tree" "$py" -u -m hookstats bench --device "$dev" --workloads "$workload" \
        --variants hookstats,detach-cpu,detach-device --repeats "$repeats" --steps "$steps" \
        --memory-steps 0 --no-progress --json "$out/bench_transformer.json" || exit 1
      report 7-bench --figure "json=bench_transformer.json"
      ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
  exit $?
fi

# ---------------------------------------------------------------- the run
only="" build_cap=120 cap_scale=1 out=${OUT:-$repo/benchmarks/results/gpu_run} budget=480 arch="" dry="" build="" skip_build="" py=${PYTHON:-python3}
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift ;;
    --budget) budget=$2; shift ;;
    --arch) arch=$2; shift ;;
    --python) py=$2; shift ;;
    --dry-run) dry=1 ;;
    --build) build=1 ;;
    --skip-build) skip_build=1 ;;
    --only) only=",$2,"; shift ;;
    --build-timeout) build_cap=$2; shift ;;
    --cap-scale) cap_scale=$2; shift ;;
    -h|--help) sed -n '2,20p' "$self"; exit 0 ;;
    *) echo "gpu_run.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
  shift
done
[[ "$budget" =~ ^[0-9]+$ ]] || { echo "gpu_run.sh: --budget takes seconds, got $budget" >&2; exit 2; }
[[ "$build_cap" =~ ^[0-9]+$ ]] || { echo "gpu_run.sh: --build-timeout takes seconds, got $build_cap" >&2; exit 2; }
[[ "$cap_scale" =~ ^[1-9][0-9]*$ ]] || { echo "gpu_run.sh: --cap-scale takes a whole number >= 1, got $cap_scale" >&2
  exit 2; }
mkdir -p "$out" && out=$(readlink -f "$out") && rm -rf "$out/steps" && mkdir -p "$out/steps"
log=$out/gpu_run.log
: > "$log"
start=$(date +%s)
deadline=$(( start + budget - 15 ))  # 15 s left for the report
export PYTHONUNBUFFERED=1

gvisor=0
if grep -qi gvisor /proc/version 2>/dev/null || dmesg 2>/dev/null | head -5 | grep -qi gvisor; then gvisor=1; fi
if [ -z "$arch" ]; then
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' ')
  arch=${arch:-9.0}
fi
tree=$repo
if [ -n "$dry" ] && [ -n "$build" ]; then  # the rehearsal: build in a copy, the checkout's _C.so untouched
  tree=${TMPDIR:-/tmp}/hookstats-gpu-run-tree
  rm -rf "$tree" && mkdir -p "$tree"
  (cd "$repo" && git ls-files -z -co --exclude-standard | xargs -0 cp --parents -t "$tree")
fi
export GPU_RUN_PY=$py GPU_RUN_OUT=$out GPU_RUN_TREE=$tree GPU_RUN_DRY=$dry GPU_RUN_BUILD=$build \
  GPU_RUN_SKIP_BUILD=$skip_build GPU_RUN_GVISOR=$gvisor GPU_RUN_ARCH=$arch

run_step() {  # NAME CAP: the step under its own timeout (CAP, or what the budget has left)
  local name=$1 cap=$2 left t s0 rc pid dog
  if [ -n "$only" ] && [[ "$only" != *",$name,"* ]]; then return; fi
  left=$(( deadline - $(date +%s) ))
  [ "$name" = 1-build ] || cap=$(( cap * cap_scale ))
  t=$(( cap < left ? cap : left ))
  if (( t < 5 )); then
    python3 "$repo/benchmarks/gpu_report.py" record "$out" "$name" --status skipped --reason "time budget spent" | tee -a "$log"
    return
  fi
  echo "== $name (timeout ${t} s, $(( $(date +%s) - start )) s into the run)" | tee -a "$log"
  s0=$(date +%s)
  # its own process group, so that a timeout ends what it started too (ninja, nvcc, ptxas, a sanitizer's target)
  rm -f "$out/.timed_out"
  setsid bash "$self" --step "$name" > >(tee -a "$log") 2>&1 &
  pid=$!
  # the watchdog: a process group of its own, ended whole with its sleep, holding none of the run's output pipes (a
  # sleep left behind would keep whoever reads the run's output, the device tool or a test, waiting out the cap)
  setsid bash -c 'sleep "$1"; : > "$2/.timed_out"; kill -TERM -- "-$3"; sleep 5; kill -KILL -- "-$3"' _ "$t" "$out" \
    "$pid" </dev/null >/dev/null 2>&1 &
  dog=$!
  wait "$pid"; rc=$?
  kill -- "-$dog" 2>/dev/null; wait "$dog" 2>/dev/null
  [ -e "$out/.timed_out" ] && rc=124 && rm -f "$out/.timed_out"
  python3 "$repo/benchmarks/gpu_report.py" record "$out" "$name" --rc "$rc" --wall $(( $(date +%s) - s0 )) --timeout "$t" \
    | tee -a "$log"
}

echo "gpu_run: out=$out budget=${budget}s arch=$arch gvisor=$gvisor python=$py tree=$tree${dry:+ (dry run)}" | tee -a "$log"
# By value: what no CPU can show first (build, correctness, bandwidth and latency, the training step), then
# graphs, the profile and the sanitizers, which a short budget may skip.
# The caps add up to the default budget's deadline (465 s); an H200 took about 200 s for all of them.
run_step 0-env 25
run_step 1-build "$build_cap"
run_step 2-correctness 50
run_step 5-bandwidth 45
run_step 7-train 90
run_step 7-bench 35
run_step 3-graphs 20
run_step 6-ncu 25
run_step 4-memcheck 25
run_step 4-racecheck 30
python3 "$repo/benchmarks/gpu_report.py" write "$out" ${dry:+--dry-run} --command "benchmarks/gpu_run.sh${dry:+ --dry-run}${build:+ --build} --arch $arch --budget $budget" \
  2>&1 | tee -a "$log"
echo "gpu_run: done in $(( $(date +%s) - start )) s" | tee -a "$log"
exit 0
