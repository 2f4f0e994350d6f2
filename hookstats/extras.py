"""The optional dependencies (pyproject.toml's extras) and the one message a missing one gives: what needs it
and the install command, which works in any environment, and from a clone of hookstats."""
import importlib

# module -> (extra, the packages that extra installs): kept equal to pyproject.toml (tests/test_extras.py)
EXTRAS = {
    "matplotlib": ("plots", ["matplotlib"]),
    "tensorboard": ("tensorboard", ["tensorboard"]),
    "pandas": ("pandas", ["pandas"]),
    "wandb": ("wandb", ["wandb"]),
    "transformers": ("hf", ["transformers", "accelerate>=1.1.0"]),
    "lightning": ("lightning", ["lightning"]),
    "fastai": ("fastai", ["fastai==2.8.12"]),
    "tqdm": (None, ["tqdm"]),  # a dependency of hookstats itself: missing only from a broken install
}


class MissingExtra(ImportError):
    """An optional dependency that is not installed; str() is one line with the command that installs it."""


def install_command(module):
    extra, packages = EXTRAS[module]
    pip = "pip install " + " ".join(f'"{p}"' if any(c in p for c in "<>=") else p for p in packages)
    return pip if extra is None else f"{pip} (or, into a clone's .venv: bash scripts/install.sh {extra})"


def missing_extra(module, what):
    """The MissingExtra to raise where `what` (e.g. "hookstats charts") needs `module`."""
    return MissingExtra(f"{what} needs {module}, which is not installed: {install_command(module)}", name=module)


def is_missing(error, module):
    """Whether ImportError `error` says `module` itself is missing (not a broken import inside it)."""
    return isinstance(error, ModuleNotFoundError) and (error.name or "").split(".")[0] == module


def require(module, what):
    """Imports `module` (a dotted name is fine); a MissingExtra naming `what` when its package is not installed."""
    top = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if is_missing(e, top):
            raise missing_extra(top, what) from None
        raise
