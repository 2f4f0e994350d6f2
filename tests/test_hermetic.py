"""The suite passes wherever the checkout lies and whatever its folder is called: a clone in a folder named
`hookstats` puts its venv, and so torch's own files, under a path that contains the package's name."""
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow  # a nested pytest run in a fresh interpreter
def test_the_hook_path_test_passes_with_torch_under_a_folder_named_hookstats(tmp_path):
    site = os.path.dirname(os.path.dirname(torch.__file__))
    (tmp_path / "hookstats").mkdir()
    (tmp_path / "hookstats" / "site").symlink_to(site)  # torch's files then say .../hookstats/site/torch/...
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "hookstats" / "site"), ROOT])}
    check = "import torch, sys; assert '/hookstats/' in torch.nn.modules.module.__file__, torch.__file__"
    subprocess.run([sys.executable, "-c", check], env=env, check=True, timeout=300)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                          "tests/test_hook_path.py::test_a_steady_state_hook_call_asks_is_compiling_once"],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]


def test_matplotlib_reads_its_own_defaults():
    """What the charts' tests see: matplotlib's defaults, not a matplotlibrc of the user running them."""
    import matplotlib
    assert matplotlib.matplotlib_fname().endswith(os.path.join("mpl-data", "matplotlibrc"))


@pytest.mark.slow  # a nested pytest run in a fresh interpreter
def test_a_users_settings_in_the_home_folder_do_not_reach_the_tests(tmp_path):
    home = tmp_path / "home"
    (home / ".config" / "matplotlib").mkdir(parents=True)
    (home / ".config" / "matplotlib" / "matplotlibrc").write_text("figure.dpi: 17\n")
    env = {k: v for k, v in os.environ.items() if k not in ("MPLCONFIGDIR", "MATPLOTLIBRC", "XDG_CONFIG_HOME")}
    env.update(HOME=str(home), PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                          "tests/test_hermetic.py::test_matplotlib_reads_its_own_defaults"],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
