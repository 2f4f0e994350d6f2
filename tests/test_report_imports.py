"""`python -m hookstats report` reads a saved run and draws it without importing torch (about 2.5 s of CPU of a
report's 10), while `import hookstats` still gives every public name on first use."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import hookstats
from hookstats.sinks import run_dir_sinks

ROOT = Path(__file__).resolve().parent.parent

# runs `python -m hookstats ARGS...` as the command line does, then prints the modules it loaded as JSON
REPORT_THEN_MODULES = """
import json, runpy, sys
sys.argv = ["hookstats", *sys.argv[1:]]
try:
    runpy.run_module("hookstats", run_name="__main__", alter_sys=True)
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    """A run with every file a report reads: history.jsonl and .csv, alerts (a NaN in a weight) and flight files."""
    run = tmp_path_factory.mktemp("run")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    mon = hookstats.attach(model, sinks=run_dir_sinks(run, tensorboard=False), log_every=2,
                           alerts=hookstats.AlertRules(flight=3), params=True)
    for step in range(8):
        if step == 5:
            with torch.no_grad():
                model[0].weight[0, 0] = float("nan")
        model(torch.randn(3, 4)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    mon.remove()
    assert list(run.glob("flight_*.jsonl")) and (run / "history.csv").is_file()
    return run


def report_modules(*argv):
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), "MPLBACKEND": "Agg"}
    r = subprocess.run([sys.executable, "-c", REPORT_THEN_MODULES, *map(str, argv)], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["code"] == 0, r.stderr[-3000:]
    return set(got["modules"])


def run_code(code):
    """`python -c code` in a fresh interpreter that imports this checkout; it must succeed."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


@pytest.mark.filterwarnings("ignore::hookstats.alerts.AlertWarning")
@pytest.mark.parametrize("history", [None, "history.csv"])
def test_report_does_not_import_torch(run_folder, tmp_path, history):
    target = run_folder if history is None else run_folder / history
    modules = report_modules("report", target, "--out", tmp_path / "charts", "--no-progress")
    assert "matplotlib" in modules and "hookstats.tools.plots" in modules  # it did draw
    assert sorted((tmp_path / "charts").glob("*.png"))
    assert not {m for m in modules if m == "torch" or m.startswith("torch.")}


def test_every_public_name_is_there_on_first_use():
    code = ("import sys, hookstats; assert 'torch' not in sys.modules; "
            "names = {n: getattr(hookstats, n) for n in hookstats.__all__}; "
            "from hookstats import attach, Monitor; "
            "assert attach is names['attach'] and Monitor is names['Monitor'] and 'torch' in sys.modules; "
            "assert callable(hookstats.plots.save_all) and sorted(dir(hookstats)) == dir(hookstats); "
            "print(sorted(names))")
    r = run_code(code)
    assert r.stdout.split() and set(hookstats.__all__) <= set(dir(hookstats))
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        hookstats.no_such_name


def test_low_precision_formats_match_torch_finfo():
    for name, dtype in {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8 e4m3": torch.float8_e4m3fn,
                        "fp8 e5m2": torch.float8_e5m2}.items():
        fi = torch.finfo(dtype)
        assert hookstats.plots.format_ranges()[name] == (fi.smallest_normal * fi.eps, fi.smallest_normal, fi.max)


def test_the_op_is_registered_by_backend_not_by_import():
    """docs/reference/op.md: `import hookstats` registers nothing; hookstats.backend() loads the engine, after which
    torch.ops.hookstats.accumulate_ is there to call directly (a saved export program, a custom kernel)."""
    code = ("import torch, hookstats; "
            "assert not hasattr(torch.ops.hookstats, 'accumulate_'); "
            "assert hookstats.backend() == 'compiled'; "
            "x = torch.tensor([1.0, -2.0, 0.0]); "
            "from hookstats.config import StatsConfig; from hookstats.buffers import TargetState; "
            "cfg = StatsConfig(); st = TargetState(None, None, 'cpu', cfg); on = torch.ones(1, dtype=torch.int32); "
            "torch.ops.hookstats.accumulate_(x, st.fstate, st.istate, st.scratch, on, cfg.op_params()); "
            "print(int(st.istate[0]))")
    assert run_code(code).stdout.split()[-1] == "3"
