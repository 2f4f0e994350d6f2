"""The documentation is tested like code: the site builds with warnings as errors, every Python example in the
README and on the site runs, and the API reference lists every public name.

A page's examples run in order in one namespace, as a reader would paste them. A page may hold a hidden setup
block, an HTML comment starting `<!--pytest-setup` (a toy model, data, a loss), run before its first example."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hookstats

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)
SETUP = re.compile(r"<!--pytest-setup\n(.*?)-->", re.S)


def pages():
    found = [ROOT / "README.md"] + sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.relative_to(DOCS).parts)
    return [p for p in found if p.is_file()]


def examples(page):
    text = page.read_text()
    return SETUP.findall(text), FENCE.findall(text)


@pytest.mark.parametrize("page", [p for p in pages() if examples(p)[1]], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_example_on_the_page_runs(page, tmp_path, monkeypatch):
    setup, blocks = examples(page)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    torch.manual_seed(0)
    namespace = {"__name__": "__docs__"}
    for i, code in enumerate(setup + blocks):
        kind = "setup" if i < len(setup) else f"example {i - len(setup) + 1}"
        try:
            exec(compile(code, f"{page.relative_to(ROOT)} ({kind})", "exec"), namespace)
        except Exception as e:  # the page and the block in the failure, not only the traceback
            raise AssertionError(f"{page.relative_to(ROOT)}, {kind} failed: {type(e).__name__}: {e}\n{code}") from e
    for obj in list(namespace.values()):
        if isinstance(obj, hookstats.Monitor):
            obj.remove()


def test_the_api_reference_documents_every_public_name():
    reference = "\n".join(p.read_text() for p in (DOCS / "reference").glob("*.md"))
    documented = set(re.findall(r"^\.\. auto\w+:: hookstats\.([\w.]+)", reference, re.M))
    missing = [n for n in hookstats.__all__ if n not in documented]
    assert not missing, f"docs/reference/ has no `.. autoX:: hookstats.<name>` entry for {missing}"


@pytest.mark.slow  # the whole site built by sphinx (a minute and more); .ci/run's docs command builds it too
def test_the_site_builds_with_warnings_as_errors(tmp_path):
    env = dict(os.environ, NO_COLOR="1")
    done = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "docs", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    page = (tmp_path / "site" / "index.html").read_text()
    assert re.search(r"Copyright\s*(&#169;|©)\s*the hookstats authors", page), "the footer names no copyright holder"
    sheets = re.findall(r'<link rel="stylesheet"[^>]*href="(_static/[^"?]+)', page)
    wraps = [s for s in sheets if re.search(r"(^|[;{\s])pre\s*{[^}]*white-space:\s*pre-wrap",
                                            (tmp_path / "site" / s).read_text())]
    assert wraps, f"no stylesheet of the page makes code blocks wrap: {sheets}"


README_COST_ROWS = {"overhead over": "attach(model) as it is: overhead over the floor's",  # before "the floor"
                    "the floor": "floor: own hooks, o.sum() + g.sum()", "at its defaults": "attach(model) as it is",
                    "histograms off": "attach(model), histograms off"}


def test_the_readme_cost_table_shows_the_current_results_files():
    text = (ROOT / "README.md").read_text()
    table = re.search(r"<!-- cost-table:begin -->\n(.*?)<!-- cost-table:end -->", text, re.S)
    assert table, "README.md has no <!-- cost-table:begin --> ... <!-- cost-table:end --> table"
    files = {"CNN": "step_floor_cnn.json", "transformer": "step_floor_transformer.json"}
    lines = [ln.strip().strip("|").split("|") for ln in table.group(1).strip().splitlines()]
    columns = [c.strip() for c in lines[0]][1:]
    assert sorted(columns) == sorted(files), columns
    results = {c: json.loads((ROOT / "benchmarks" / "results" / files[c]).read_text())["results"] for c in columns}
    seen = set()
    for cells in lines[2:]:
        key = next(k for k in README_COST_ROWS if k in cells[0])
        seen.add(key)
        for column, cell in zip(columns, cells[1:]):
            expected = f"{results[column][README_COST_ROWS[key]]['ratio']:.3f}"
            assert cell.strip() == expected, f"README cost table, {key!r} / {column}: {cell.strip()} != {expected}"
    assert seen == set(README_COST_ROWS), f"README cost table lacks rows for {set(README_COST_ROWS) - seen}"


def test_the_readme_overhead_row_says_what_it_divides():
    """The overhead row is a ratio of ratios: its label says so, and what the floor it is measured against is."""
    text = (ROOT / "README.md").read_text()
    table = re.search(r"<!-- cost-table:begin -->\n(.*?)<!-- cost-table:end -->", text, re.S).group(1)
    label = next(ln for ln in table.splitlines() if "overhead over" in ln).strip("|").split("|")[0]
    assert "your own hooks" in label and "(ratio − 1) / (floor's ratio − 1)" in label, label


def test_readme_and_getting_started_give_the_same_commands_and_extras():
    """A reader of either page runs the same two commands and hears of the same extras (pyproject.toml's, less the
    bundles demo and test)."""
    readme, start = (ROOT / "README.md").read_text(), (DOCS / "getting-started.md").read_text()
    for name in ("demo-command", "test-command"):
        block = re.search(rf"<!-- {name}:begin -->\n```\n(.*?)\n```", readme, re.S).group(1).strip()
        assert block in start, f"docs/getting-started.md does not give README's {name}: {block}"
    import tomllib
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    extras -= {"demo", "test"}
    listed = set(re.findall(r"`(\w+)`", re.search(r"for the extras \((.*?)\)", readme, re.S).group(1)))
    assert listed == extras, ("README.md", listed ^ extras)
    line = re.search(r"# extras: ([\w, ]+)", start).group(1)
    assert set(line.replace(" ", "").split(",")) == extras, ("docs/getting-started.md", line)
