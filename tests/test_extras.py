"""A missing optional dependency (every optional import in hookstats): one line naming what needs it and the
install command, raised as hookstats.extras.MissingExtra; the command line prints it without a traceback and
exits with status 1. The missing module is simulated with sys.modules[name] = None."""
import ast
import importlib
import pathlib
import sys
import tomllib

import pytest

import hookstats
from hookstats.tools import cli
from hookstats.extras import EXTRAS, MissingExtra

ROOT = pathlib.Path(hookstats.__file__).parent.parent
# what the optional packages bring along (imported by hookstats only where their extra's package is)
BROUGHT_ALONG = {"fastcore": "fastai", "pytorch_lightning": "lightning", "accelerate": "transformers"}
REQUIRED = {"torch", "numpy", "tqdm", "ninja", "pybind11", "setuptools", "hookstats"}
# the user's own framework: hookstats/paddle/ is imported only for a paddle.nn.Layer (the paddle extra)
USERS_FRAMEWORK = {"paddle"}


def hide(monkeypatch, *modules):
    for name in modules:  # and its submodules, which another test may have imported in this process
        for loaded in [m for m in sys.modules if m.startswith(name + ".")]:
            monkeypatch.setitem(sys.modules, loaded, None)
        monkeypatch.setitem(sys.modules, name, None)
    for name in [m for m in sys.modules if m.startswith("hookstats.integrations.")]:
        monkeypatch.delitem(sys.modules, name)


def one_line_with_install(text, module):
    text = str(text).strip()
    assert "\n" not in text and "Traceback" not in text
    assert module in text and "pip install " in text
    extra = EXTRAS[module][0]
    if extra is not None:
        assert f"bash scripts/install.sh {extra}" in text


def test_the_extras_are_pyproject_tomls():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for module, (extra, packages) in EXTRAS.items():
        if extra is not None:
            assert sorted(extras[extra]) == sorted(packages), extra
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "tqdm" in deps


def imported_modules():
    for path in (ROOT / "hookstats").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                yield from ((path, a.name.split(".")[0]) for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                yield path, node.module.split(".")[0]
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "require" and node.args \
                    and isinstance(node.args[0], ast.Constant):
                yield path, node.args[0].value.split(".")[0]


def test_every_third_party_import_of_hookstats_is_a_dependency_or_an_extra():
    unknown = {(p.name, m) for p, m in imported_modules()
               if m not in sys.stdlib_module_names and m not in REQUIRED and m not in EXTRAS and m not in BROUGHT_ALONG
               and m not in USERS_FRAMEWORK}
    assert not unknown


def library_calls():
    def figure():
        from hookstats.tools import plots
        plots.plot_dynamic_range({})

    def tensorboard_sink(tmp):
        from hookstats.sinks import TensorBoardSink
        TensorBoardSink(log_dir=tmp)

    def wandb_sink(tmp):
        from hookstats.sinks import WandbSink
        WandbSink(mode="disabled")

    def to_frame(tmp):
        from hookstats.tools.summary import Summary
        Summary([{"a": 1}], ["a"], "t").to_frame()

    def progress(tmp):
        from hookstats.tools.progress import progress
        progress(range(2))

    def integration(name):
        return lambda tmp: importlib.import_module(f"hookstats.integrations.{name}")
    return {"matplotlib": lambda tmp: figure(), "tensorboard": tensorboard_sink, "wandb": wandb_sink,
            "pandas": to_frame, "tqdm": progress, "transformers": integration("hf"),
            "lightning": integration("lightning"), "fastai": integration("fastai")}


@pytest.mark.parametrize("module", list(EXTRAS))
def test_each_missing_extra_is_one_line_with_its_install_command(monkeypatch, tmp_path, module):
    calls = library_calls()
    assert set(calls) == set(EXTRAS)
    hide(monkeypatch, module, *(["pytorch_lightning"] if module == "lightning" else []))
    with pytest.raises(MissingExtra) as e:
        calls[module](tmp_path)
    one_line_with_install(e.value, module)
    assert isinstance(e.value, ImportError) and e.value.name == module


def run_cli(capsys, *argv):
    try:
        code = cli.main(list(argv))
    except SystemExit as e:
        code = e.code
    return code, *capsys.readouterr()


@pytest.mark.parametrize("module, argv", [
    ("tensorboard", ["demo", "--steps", "1", "--models", "cnn"]),
    ("matplotlib", ["demo", "--steps", "1", "--models", "cnn", "--no-tensorboard"]),
    ("transformers", ["plan", "gpt2"]),
    ("matplotlib", ["report", "RUN"]),
])
def test_the_command_line_says_the_missing_extra_in_one_line_and_fails(monkeypatch, tmp_path, capsys, module, argv):
    run = tmp_path / "run"
    run.mkdir()
    (run / "history.csv").write_text("step,target,module,kind,leaf,stat,value\n0,fc:output,fc,output,,mean,0.5\n")
    argv = [str(run) if a == "RUN" else a for a in argv]
    if argv[0] == "demo":
        argv += ["--out", str(tmp_path / "demo")]
    hide(monkeypatch, module)
    code, out, err = run_cli(capsys, *argv)
    assert code == 1
    one_line_with_install(err, module)
    assert err.startswith(f"hookstats {argv[0]}: error: ")
    assert not (tmp_path / "demo").exists() or not any((tmp_path / "demo").iterdir())  # said before training


def test_a_disabled_progress_bar_needs_no_tqdm(monkeypatch):
    """`bench --no-progress` and `report --no-progress` run where tqdm is missing (a bare GPU machine)."""
    from hookstats.tools.progress import progress
    hide(monkeypatch, "tqdm")
    assert list(progress(range(3), enabled=False)) == [0, 1, 2]
    with progress(total=4, enabled=False) as bar:  # what the commands call on a bar
        bar.update()
        bar.set_postfix_str("done: 1", refresh=False)
        bar.set_description("transformer")
    from hookstats.tools.bench import command
    out = command.run(["stack4"], [command.BASELINE], repeats=1, steps=1, memory_steps=0, show_progress=False)
    assert list(out["workloads"]) == ["stack4"]


def test_demo_trains_with_no_progress_and_no_tqdm(monkeypatch, tmp_path):
    """`demo --no-progress`: the training loop asks the disabled bar what tqdm's bar answers (disable, postfix)."""
    import torch
    from hookstats.tools.demo import train_one
    hide(monkeypatch, "tqdm")
    mon, _, _, _ = train_one("cnn", tmp_path, torch.device("cpu"), 3, tensorboard=False, progress=False)
    assert mon.step_count == 3


def test_demo_trains_on_one_cpu_thread_and_restores_the_setting(monkeypatch, tmp_path):
    """The demo's tiny models train on one intra-op thread (a second only spin-waits); the caller's count is back
    after, also when training fails."""
    import torch
    from hookstats.tools import demo
    seen = []
    real = demo.attach

    def spy(*a, **k):
        seen.append(torch.get_num_threads())
        return real(*a, **k)

    monkeypatch.setattr(demo, "attach", spy)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        demo.train_one("cnn", tmp_path, torch.device("cpu"), 2, tensorboard=False, progress=False)
        assert seen == [1] and torch.get_num_threads() == 2
        monkeypatch.setattr(demo, "attach", lambda *a, **k: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            demo.train_one("cnn", tmp_path, torch.device("cpu"), 2, tensorboard=False, progress=False)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
