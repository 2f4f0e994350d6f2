# The documentation site: Sphinx (as PyTorch's own docs) with MyST, so pages are Markdown like the README, and
# furo, a maintained theme. Built with warnings as errors: `python -m sphinx -W --keep-going -b html docs docs/_build`.
import inspect
import os
import sys

sys.path.insert(0, os.path.abspath(".."))
sys.path.insert(0, os.path.abspath("_ext"))

project = "hookstats"
author = "the hookstats authors"
copyright = "the hookstats authors"
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.viewcode", "results"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "_ext"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
autodoc_typehints = "description"
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "undoc-members": False}
# The framework callbacks' pages import fastai, Lightning and transformers, which only their extras install:
# mocked, so the docs extra alone builds the site, and the pages read the same with or without them.
autodoc_mock_imports = ["fastai", "fastcore", "lightning", "pytorch_lightning", "transformers"]
html_theme = "furo"
html_title = "hookstats"
html_static_path = ["_static"]
html_css_files = ["wrap.css"]  # code blocks wrap rather than scroll
default_role = "code"


def _own_init_signature(app, what, name, obj, options, signature, return_annotation):
    """A class on a mocked base takes the mock's __new__(*args, **kwargs) as its signature: its own __init__'s."""
    if what == "class" and signature == "(*args, **kwargs)" and "__init__" in vars(obj):
        sig = inspect.signature(obj.__init__)
        sig = sig.replace(parameters=list(sig.parameters.values())[1:], return_annotation=inspect.Signature.empty)
        return str(sig), return_annotation


def setup(app):
    app.connect("autodoc-process-signature", _own_init_signature)
