#!/usr/bin/env bash
# Creates .venv and installs hookstats into it: `bash scripts/install.sh demo` or `... test`.
# torch is pinned first and the extension is built with --no-build-isolation against it, so pip never
# pulls a multi-GB CUDA torch into an isolated build environment.
set -euo pipefail
cd "$(dirname "$0")/.."
extra="${1:-demo}"
venv="${HOOKSTATS_VENV:-.venv}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pip=("$venv/bin/pip" install --disable-pip-version-check -q)
"${pip[@]}" "torch==${HOOKSTATS_TORCH:-2.13.0}" setuptools wheel ninja pybind11
MAX_JOBS="${MAX_JOBS:-2}" "${pip[@]}" --no-build-isolation -e ".[$extra]" "torch==${HOOKSTATS_TORCH:-2.13.0}"
# fastai drags in a PyPI torchvision that does not load beside this torch ("torchvision::nms does not
# exist") and breaks the imports of lightning and transformers; nothing here uses torchvision.
if "$venv/bin/python" -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('torchvision') is None)"; then
  "$venv/bin/python" -c "import torchvision" 2>/dev/null || "$venv/bin/pip" uninstall -y -q torchvision
fi
"$venv/bin/python" -c "import hookstats; print('hookstats', hookstats.__version__, 'backend:', hookstats.backend())"
