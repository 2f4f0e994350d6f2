#!/usr/bin/env bash
# Runs the tests that depend on torch's version against other torch releases from PyPI: each in a venv of its own
# (${HOOKSTATS_CACHE:-~/.cache/hookstats}/torch-VERSION, about 5 GB: PyPI's Linux wheels carry CUDA), on a copy of
# the tree whose op is built with its CPU kernel only (HOOKSTATS_FORCE_CUDA=0: that torch's CUDA need not match
# nvcc's). By default torch.compile, the state store and the op's registration; arguments after -- go to pytest.
#   bash scripts/torch_versions.sh 2.4.1 2.6.0 2.8.0 2.11.0
#   bash scripts/torch_versions.sh 2.6.0 -- -n 2 -m "not slow" --deselect tests/test_docs.py
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
versions=() tests=()
while [ $# -gt 0 ]; do
  if [ "$1" = "--" ]; then shift; tests=("$@"); break; fi
  versions+=("$1"); shift
done
[ ${#versions[@]} -gt 0 ] || { sed -n '2,7p' "$0"; exit 2; }
run_tests() { (cd "$tree" && OMP_NUM_THREADS=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@") || failed=1; }
cache=${HOOKSTATS_CACHE:-$HOME/.cache/hookstats}
failed=0
for v in "${versions[@]}"; do
  venv=$cache/torch-$v tree=$(mktemp -d)
  echo "== torch $v ($venv)"
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import torch, pytest" 2>/dev/null; then
    python3 -m venv "$venv" && "$venv/bin/pip" install -q --disable-pip-version-check "torch==$v" numpy ninja \
      pybind11 tqdm pytest pytest-xdist hypothesis "setuptools>=77" wheel || { echo "torch $v: install failed"; failed=1; continue; }
  fi
  (cd "$repo" && git ls-files -z -co --exclude-standard | xargs -0 cp --parents -t "$tree")
  if ! (cd "$tree" && HOOKSTATS_FORCE_CUDA=0 MAX_JOBS="${MAX_JOBS:-2}" "$venv/bin/python" setup.py -q build_ext --inplace \
        > build.log 2>&1); then
    tail -20 "$tree/build.log"; echo "torch $v: build failed"; failed=1; rm -rf "$tree"; continue
  fi
  if [ ${#tests[@]} -gt 0 ]; then
    run_tests "${tests[@]}"
  else  # the op's tests in a process of their own: torch 2.4's inductor leaves its process flushing subnormals
    # to zero (a library built with -ffast-math), which the op's subnormal tests would then see
    run_tests tests/test_compile.py
    run_tests tests/test_state.py tests/test_accumulate.py
  fi
  rm -rf "$tree"
done
exit $failed
