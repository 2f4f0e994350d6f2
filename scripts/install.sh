#!/usr/bin/env bash
# Creates .venv and installs hookstats into it: `bash scripts/install.sh demo` or `... test`.
# torch is pinned first and the op is built ahead of time with --no-build-isolation against it, so pip never
# pulls a multi-GB CUDA torch into an isolated build environment. HOOKSTATS_TORCH picks another torch.
set -euo pipefail
cd "$(dirname "$0")/.."
extra="${1:-demo}"
venv="${HOOKSTATS_VENV:-.venv}"
torch_version="${HOOKSTATS_TORCH:-2.13.0}"
# The torchvision built for each torch (fastai depends on it): pinned, so pip never pairs a mismatched one.
case "$torch_version" in
  2.13.0) torchvision=0.28.0 ;;
  2.14.1) torchvision=0.29.1 ;;
  2.9.1) torchvision=0.24.1 ;;
  *) torchvision="" ;;
esac
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pins=$(mktemp)
trap 'rm -f "$pins"' EXIT
echo "torch==$torch_version" > "$pins"
[ -z "$torchvision" ] || echo "torchvision==$torchvision" >> "$pins"
# pip byte-compiles what it installs (no --no-compile): with PYTHONDONTWRITEBYTECODE=1, as on many CI machines,
# Python would otherwise compile torch and the rest again in every process that imports them.
pip=("$venv/bin/pip" install --disable-pip-version-check -q -c "$pins")
"${pip[@]}" "torch==$torch_version" "setuptools>=77" wheel ninja pybind11
# The op's build (MAX_JOBS compilers) runs while pip installs the extra's packages (one core, mostly unpacking):
# they overlap instead of following each other. The editable install itself builds nothing (HOOKSTATS_NO_EXT=1);
# the op lands in hookstats/ beside the sources, where the editable package finds it.
build_log=$(mktemp)
trap 'rm -f "$pins" "$build_log"; [ -z "${build:-}" ] || kill "$build" 2>/dev/null || true' EXIT
MAX_JOBS="${MAX_JOBS:-2}" "$venv/bin/python" setup.py -q build_ext --inplace >"$build_log" 2>&1 &
build=$!
HOOKSTATS_NO_EXT=1 "${pip[@]}" --no-build-isolation -e ".[$extra]"
if ! wait "$build"; then
  build=""
  cat "$build_log" >&2
  echo "install.sh: building the op failed (its log is above)" >&2
  exit 1
fi
build=""
# PyPI's torchvision wheels are built against the CUDA torch of the same version: beside a CPU-only torch
# (2.13.0 here is one) its ops do not load ("torchvision::nms does not exist"), and every import of it fails,
# including lightning's and transformers'. Such a torchvision is removed, and the reason said.
if "$venv/bin/python" -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('torchvision') is None)"; then
  if ! "$venv/bin/python" -c "import torchvision" 2>/dev/null; then
    "$venv/bin/pip" uninstall -y -q torchvision
    echo "install.sh: removed torchvision: PyPI's wheel does not load beside torch $("$venv/bin/python" -c \
'import torch; print(torch.__version__)') (a CPU build). fastai's vision API (fastai.vision.all) needs it;" \
"everything else here works without it. For a torch/torchvision pair that loads here, HOOKSTATS_TORCH=2.14.1" \
"(CUDA builds, about 5.5 GB)." >&2
  fi
fi
"$venv/bin/python" -c "import hookstats; print('hookstats', hookstats.__version__, 'backend:', hookstats.backend())"
