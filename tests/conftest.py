"""Shared fixtures: the two implementations of the op (compiled kernel, pure-PyTorch reference); histograms on
every step for the test files whose oracles count them so."""
import atexit
import fcntl
import os
import shutil
import sys
import tempfile

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

# Hermetic: the settings a user keeps in the home folder (matplotlibrc, wandb's settings and caches) do not reach
# the tests; set before any of those libraries is imported, and inherited by the processes tests start.
_SETTINGS = tempfile.mkdtemp(prefix="hookstats-tests-")
atexit.register(shutil.rmtree, _SETTINGS, True)
for _var in ("MPLCONFIGDIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
    os.environ[_var] = os.path.join(_SETTINGS, _var.lower())
for _var in ("MATPLOTLIBRC", "WANDB_MODE", "WANDB_API_KEY", "WANDB_ENTITY", "WANDB_PROJECT", "WANDB_DIR"):
    os.environ.pop(_var, None)

import hookstats  # noqa: E402
from hookstats import reference  # noqa: E402

# `import hookstats` loads the op lazily (its first attach); test modules name torch.ops.hookstats at import, so it
# is loaded here, whichever test file runs first or alone
hookstats.backend()

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]

# pytest-xdist: each worker takes its share of the cores (2 workers x 2 OpenMP threads on 2 cores spin against
# each other); the processes a test starts inherit it. The kernel's threaded path is tested at set thread counts
# (helpers.on_thread_counts), whatever the default.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _threads = max(1, torch.get_num_threads() // _WORKERS)
    os.environ.setdefault("OMP_NUM_THREADS", str(_threads))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def _compiled():
    if hookstats.backend() != "compiled":
        pytest.fail("the compiled extension is not loaded: build it with `pip install --no-build-isolation -e .` "
                    "(set HOOKSTATS_BACKEND=reference to test the reference path alone)")
    return torch.ops.hookstats.accumulate_.default


def made_once(tmp_path_factory, name, make):
    """A folder that make(folder) fills once for the whole run, for a module's expensive fixture (a demo run,
    sanitizer or nvcc builds): pytest-xdist's workers share it, the first makes it, the others wait on the lock.
    Tests only read it."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder, above each worker's own
    folder = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / ".made").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            (folder / ".made").touch()
    return folder


@pytest.fixture(params=["compiled", "reference"])
def op(request):
    """accumulate_ of either backend (the reference is also the fallback users get without a compiler)."""
    if request.param == "compiled":
        if os.environ.get("HOOKSTATS_BACKEND") == "reference":
            pytest.skip("HOOKSTATS_BACKEND=reference")
        return _compiled()
    return reference.accumulate_


@pytest.fixture(scope="module")
def every_step_histograms():
    """The default hist_every is 1 in a test module (module fixtures included): for the files whose oracles count
    the histograms of every step they see (loops, callbacks, charts of several steps). The cadence itself:
    tests/test_hist_cadence.py."""
    from hookstats import config
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(config, "HIST_EVERY", 1)
        yield


@pytest.fixture(params=["compiled", "reference"])
def backend(request, monkeypatch):
    """The test runs on the compiled op and on the pure-PyTorch reference (what runs without the extension)."""
    if request.param == "reference":
        from hookstats import accumulate
        monkeypatch.setattr(accumulate, "accumulate_", reference.accumulate_)
        monkeypatch.setattr(accumulate, "accumulate_many_", reference.accumulate_many_)
    return request.param


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches and counters (graph breaks, unique graphs) start empty and are reset after the test."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()
