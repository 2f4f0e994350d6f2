"""pytest-benchmark cases of one training step per workload and variant (hookstats.tools.bench's models and
variants). The interleaved comparison with ratios, syncs and memory is benchmarks/step_overhead.py."""
import re

import pytest

from hookstats.tools import bench


@pytest.mark.parametrize("variant", bench.available_variants(), ids=lambda v: re.sub(r"[^0-9A-Za-z]+", "-", v).strip("-"))
@pytest.mark.parametrize("workload", ["cnn", "transformer", "stack128"])
def test_step(benchmark, workload, variant):
    model, step = bench.make_workload(workload)
    inst = bench.VARIANTS[variant](model)
    try:
        def run():
            step()
            inst.after_step()
        run()
        benchmark.pedantic(run, rounds=5, iterations=2, warmup_rounds=1)
    finally:
        inst.remove()
