"""pytest-benchmark cases of the op alone (one per variant, dtype and size), for --benchmark-save/compare.
The interleaved comparison with ratios is benchmarks/op_throughput.py; nothing here asserts a time."""
import re

import pytest
import torch

import op_throughput

SIZES = [1 << 20, 16 << 20, 256 << 20]
VARIANTS = op_throughput.variants(compile_reference=False)
_inputs = {}


def tensor(dtype, nbytes):
    key = (dtype, nbytes)
    if key not in _inputs:
        _inputs.clear()  # one input alive at a time: 256 MB each
        _inputs[key] = torch.randn(nbytes // torch.tensor([], dtype=dtype).element_size()).to(dtype)
    return _inputs[key]


def slug(s):
    return re.sub(r"[^0-9A-Za-z]+", "-", s).strip("-")


@pytest.mark.parametrize("variant", list(VARIANTS), ids=slug)
@pytest.mark.parametrize("nbytes", SIZES, ids=lambda b: slug(op_throughput.size_label(b)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=lambda d: str(d)[6:])
def test_op(benchmark, dtype, nbytes, variant):
    if nbytes > SIZES[0] and variant.startswith(("fastai", "reference")):
        benchmark.pedantic(VARIANTS[variant], args=(tensor(dtype, nbytes),), rounds=3, iterations=1)
    else:
        benchmark(VARIANTS[variant], tensor(dtype, nbytes))
    benchmark.extra_info["GB/s"] = nbytes / benchmark.stats.stats.median / 1e9
