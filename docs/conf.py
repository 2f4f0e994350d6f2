# The documentation site: Sphinx (as PyTorch's own docs) with MyST, so pages are Markdown like the README, and
# furo, a maintained theme. Built with warnings as errors: `python -m sphinx -W --keep-going -b html docs docs/_build`.
import os
import sys

sys.path.insert(0, os.path.abspath(".."))
sys.path.insert(0, os.path.abspath("_ext"))

project = "hookstats"
author = "the hookstats authors"
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.viewcode", "results"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "_ext"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
autodoc_typehints = "description"
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "undoc-members": False}
html_theme = "furo"
html_title = "hookstats"
default_role = "code"
