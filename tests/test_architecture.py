"""The package's files talk through public names: no object reaches into a private member (`_name`) that a
class of another file defines, and no file uses another module's private functions; tests/ and benchmarks/ use
hookstats through public names too; the hooks never import the Monitor; no import cycles among the modules; the
engine never imports hookstats.tools. Read from the AST."""
import ast
import functools
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "hookstats"
OUTSIDE = (ROOT / "tests", ROOT / "benchmarks")
ACCESSORS = ("getattr", "hasattr", "setattr", "delattr")


def parsed(path):
    """A file's syntax tree, parsed once per text for all of this module's checks (they only read it; the checks
    of the checks rewrite their files)."""
    return _tree(path.read_text(), str(path))


@functools.lru_cache(maxsize=None)
def _tree(text, name):
    return ast.parse(text, name)


_WALKED = {}


def walk(node):
    """ast.walk(node) as a list, made once per node: the checks walk the same files again and again. The node is
    kept with its list, so its id is never another's."""
    if id(node) not in _WALKED:
        _WALKED[id(node)] = (node, list(ast.walk(node)))
    return _WALKED[id(node)][1]


def private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def is_self(node):
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def class_members(tree):
    """Private names the classes of one file define: methods, class attributes, __slots__ and attributes set
    on self/cls."""
    names = set()
    for cls in (n for n in walk(tree) if isinstance(n, ast.ClassDef)):
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AnnAssign) else []
            for t in targets:
                if isinstance(t, ast.Name):
                    names.add(t.id)
                    if t.id == "__slots__":
                        names.update(e.value for e in ast.walk(node.value)
                                     if isinstance(e, ast.Constant) and isinstance(e.value, str))
        for node in ast.walk(cls):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and is_self(node.value):
                names.add(node.attr)
    return {n for n in names if private(n)}


def module_privates(tree):
    """Private functions, classes and globals a module defines at its top level."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(e.id for e in ast.walk(t) if isinstance(e, ast.Name))
    return {n for n in names if private(n)}


def module_name(path, package):
    rel = path.relative_to(package.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imported_names(tree, path, package):
    """local name -> dotted name of each package name the file imports (a module, function or class)."""
    here = module_name(path, package).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    out = {}
    for node in walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            base = ".".join(base + ([node.module] if node.module else []))
            for a in node.names:
                out[a.asname or a.name] = f"{base}.{a.name}" if base else a.name
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "hookstats":
                    if a.asname:
                        out[a.asname] = a.name
                    else:
                        out["hookstats"] = "hookstats"
    return out


def accesses(tree):
    """(node, object node, attribute name) of every attribute read or written, getattr(x, "name") too."""
    for node in walk(tree):
        if isinstance(node, ast.Attribute):
            yield node, node.value, node.attr
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ACCESSORS \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str):
            yield node, node.args[0], node.args[1].value


def cross_file_uses(package=PACKAGE):
    """'file:line: what' for every private member of another file's class, or another module's private name,
    used in the package."""
    files = {p: parsed(p) for p in sorted(package.rglob("*.py"))}
    members = {p: class_members(t) for p, t in files.items()}
    privates = {module_name(p, package): module_privates(t) for p, t in files.items()}
    found = []
    for path, tree in files.items():
        others = set().union(*(m for p, m in members.items() if p != path)) - members[path]
        modules = imported_names(tree, path, package)
        for node, obj, attr in accesses(tree):
            if not private(attr) or is_self(obj):
                continue
            target = modules.get(obj.id) if isinstance(obj, ast.Name) else None
            if target in privates and target != module_name(path, package):
                if attr in privates[target]:
                    found.append(f"{path.relative_to(package.parent)}:{node.lineno}: {obj.id}.{attr}")
            elif attr in others:
                found.append(f"{path.relative_to(package.parent)}:{node.lineno}: {ast.unparse(obj)}.{attr}")
        for node in walk(tree):  # from .targets import _private
            if isinstance(node, ast.ImportFrom) and node.level:
                for a in node.names:
                    if private(a.name) and a.name != "_C" and modules.get(a.asname or a.name) not in privates:
                        found.append(f"{path.relative_to(package.parent)}:{node.lineno}: imports {a.name}")
    return sorted(found, key=lambda f: (f.split(":")[0], int(f.split(":")[1])))


def test_no_private_member_used_across_files():
    found = cross_file_uses()
    assert not found, "private members used outside the file that owns them:\n" + "\n".join(found)


def test_the_check_finds_a_reach_across_files(tmp_path):
    """The scan itself: a private member of another file's class, used through any object but self (getattr
    too), and another module's private function are found; a file's own privates and self's are not."""
    pkg = tmp_path / "hookstats"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "owner.py").write_text("class Owner:\n    def __init__(self):\n        self._secret = 1\n"
                                  "    def _helper(self):\n        return self._secret\n"
                                  "def _module_helper():\n    return 0\n"
                                  "def peek(o):\n    return o._secret, _module_helper()\n")
    (pkg / "user.py").write_text("from . import owner\nfrom .owner import _module_helper as helper\n"
                                 "def read(o):\n    return o._secret, o.public\n"
                                 "def call(o):\n    return getattr(o, '_helper')()\n"
                                 "def free():\n    return owner._module_helper()\n"
                                 "class User:\n    def __init__(self, o):\n        self.o = o\n        self._mine = 2\n"
                                 "    def mine(self):\n        return self._mine, self.o._secret\n")
    found = cross_file_uses(pkg)
    assert [f.split(": ", 1)[1] for f in found] == ["imports _module_helper", "o._secret", "o._helper",
                                                    "owner._module_helper", "self.o._secret"]


def package_imports(tree):
    """local name -> dotted name of each hookstats module or name a file outside the package imports."""
    out = {}
    for node in walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "hookstats":
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "hookstats":
                    out[a.asname or a.name.split(".")[0]] = a.name if a.asname else "hookstats"
    return out


def dotted(node, names):
    """The dotted hookstats name an expression stands for (hookstats.history, hist_mod), or None."""
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.Attribute):
        base = dotted(node.value, names)
        return None if base is None else f"{base}.{node.attr}"
    return None


def outside_uses(package=PACKAGE, dirs=OUTSIDE):
    """'file:line: what' for every private member of a hookstats class, or private name of a hookstats module,
    used by the files under `dirs` (tests, benchmarks); a file's own classes' privates are its own."""
    files = [parsed(p) for p in sorted(package.rglob("*.py"))]
    members = set().union(*(class_members(t) for t in files))
    privates = {module_name(p, package): module_privates(t) for p, t in zip(sorted(package.rglob("*.py")), files)}
    found = []
    for path in sorted(p for d in dirs for p in d.rglob("*.py")):
        tree = parsed(path)
        own = class_members(tree) | module_privates(tree)
        names = package_imports(tree)
        where = path.relative_to(path.parents[1])
        for node, obj, attr in accesses(tree):
            if not private(attr) or is_self(obj) or attr in own:
                continue
            target = dotted(obj, names)
            if target in privates:
                if attr in privates[target]:
                    found.append(f"{where}:{node.lineno}: {ast.unparse(obj)}.{attr}")
            elif attr in members:
                found.append(f"{where}:{node.lineno}: {ast.unparse(obj)}.{attr}")
        for node in walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "hookstats":
                found += [f"{where}:{node.lineno}: imports {a.name}" for a in node.names if private(a.name)]
    return sorted(found, key=lambda f: (f.split(":")[0], int(f.split(":")[1])))


def test_tests_and_benchmarks_use_hookstats_through_public_names():
    found = outside_uses()
    assert not found, "hookstats' private members used from tests/ or benchmarks/:\n" + "\n".join(found)


def test_the_hooks_never_import_the_monitor():
    """hookstats/hooks/ works through its Port (state owner and step clock), not through a Monitor."""
    found = []
    for path in sorted((PACKAGE / "hooks").rglob("*.py")):
        for node, name in imported_names(parsed(path), path, PACKAGE).items():
            if name.split(".")[:2] == ["hookstats", "monitor"]:
                found.append(f"{path.relative_to(ROOT)}: {node}")
    assert not found, found


def test_the_outside_check_finds_a_private_use(tmp_path):
    pkg, tests = tmp_path / "hookstats", tmp_path / "tests"
    pkg.mkdir(), tests.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "owner.py").write_text("class Owner:\n    def __init__(self):\n        self._secret = 1\n"
                                  "def _module_helper():\n    return 0\n")
    (tests / "test_x.py").write_text("import hookstats.owner as ow\nfrom hookstats import owner\n"
                                     "from hookstats.owner import _module_helper\n"
                                     "class Mine:\n    def __init__(self):\n        self._own = 1\n"
                                     "def test(o, m):\n    return o._secret, ow._module_helper(), owner._module_helper, m._own\n")
    found = outside_uses(pkg, (tests,))
    assert sorted(f.split(": ", 1)[1] for f in found) == ["imports _module_helper", "o._secret", "ow._module_helper",
                                                          "owner._module_helper"]


# ---- the raw state: one table (hookstats/rawstate.py) merges and empties every state ----
TABLE_MODULE = PACKAGE / "rawstate.py"


def is_nan(node):
    """math.nan, np.nan, float("nan")."""
    if isinstance(node, ast.Attribute):
        return node.attr == "nan"
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "float" and \
        len(node.args) == 1 and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).lower() == "nan"


def is_empty_state(node):
    """A written-out empty fstate: [0, 0, 0, nan, nan] (a list or tuple, any spelling of 0 and NaN)."""
    if not isinstance(node, (ast.List, ast.Tuple)) or len(node.elts) != 5:
        return False
    zeros, nans = node.elts[:3], node.elts[3:]
    return all(isinstance(e, ast.Constant) and e.value == 0 for e in zeros) and all(is_nan(e) for e in nans)


def factors(node):
    """The factors of a product a * b * c ..., flattened."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return factors(node.left) + factors(node.right)
    return [node]


def is_chan_merge(node):
    """The cross term of Chan's merge of M2, d * d * na * frac (any names): a product of a name squared and two
    other names (n * mean * mean, the sum of squares, is not one)."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)):
        return False
    names = [f.id for f in factors(node) if isinstance(f, ast.Name)]
    squared = {n for n in names if names.count(n) > 1}
    return bool(squared) and len(set(names) - squared) >= 2


def oracle_functions(tree):
    """Nodes inside functions whose name says they are an oracle: a test's own float64 computation, written out."""
    inside = set()
    for fn in walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and "oracle" in fn.name:
            inside.update(id(n) for n in ast.walk(fn))
    return inside


def raw_state_writes(paths, test):
    """'file:line' of every node `test` accepts in `paths`, but in rawstate.py and in oracle functions."""
    found = []
    for path in paths:
        if path == TABLE_MODULE:
            continue
        tree = parsed(path)
        skip = oracle_functions(tree)
        found += sorted({f"{path.relative_to(path.parents[1])}:{n.lineno}" for n in walk(tree)
                         if test(n) and id(n) not in skip})
    return found


def test_no_empty_state_written_out_but_in_the_table():
    """States are allocated and emptied with rawstate.empty(): in the package, the tests and the benchmarks alike
    (oracles, which compute what a state should hold on their own, excepted)."""
    paths = sorted(PACKAGE.rglob("*.py")) + sorted(p for d in OUTSIDE for p in d.rglob("*.py"))
    found = raw_state_writes(paths, is_empty_state)
    assert not found, "an empty state written out (use hookstats.rawstate.empty()):\n" + "\n".join(found)


def test_no_chan_merge_in_the_package_but_in_the_table():
    """States merge with rawstate.combine() (calls, steps, the ring, reduce(), the reference): one Chan merge."""
    found = raw_state_writes(sorted(PACKAGE.rglob("*.py")), is_chan_merge)
    assert not found, "a Chan merge outside hookstats/rawstate.py (use rawstate.combine()):\n" + "\n".join(found)


def test_records_are_derived_from_states_in_records_py_alone():
    """Every record built from raw states comes from hookstats/records.py (stats(), reduce(), the history)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in ("records.py", "statistics.py"):
            continue
        tree = parsed(path)
        found += [f"{path.relative_to(ROOT)}:{n.lineno}" for n in walk(tree)
                  if isinstance(n, ast.Attribute) and n.attr == "derive_rows"
                  or isinstance(n, ast.alias) and n.name == "derive_rows"]
    assert not found, found


def test_the_raw_state_checks_find_what_they_look_for(tmp_path):
    src = ("import math\nimport numpy as np\n"
           "def alloc():\n    return [0.0, 0.0, 0, math.nan, float('nan')]\n"
           "def merge(na, nb, d, frac, m2a):\n    return m2a + d * d * na * frac\n"
           "def oracle_state():\n    return (0, 0, 0, np.nan, np.nan), d * d * n * f\n"
           "def fine(mean, n):\n    return [0.0, 0.0, 0.0, 1.0, math.nan], mean * mean + n, a * b * c\n")
    path = tmp_path / "pkg" / "mod.py"
    path.parent.mkdir()
    path.write_text(src)
    assert raw_state_writes([path], is_empty_state) == ["pkg/mod.py:4"]
    assert raw_state_writes([path], is_chan_merge) == ["pkg/mod.py:6"]


# ---- one owner per concept ----
KIND_VALUES = ("output", "grad_output", "input", "grad_input", "param_grad", "param", "watch", "watch_grad")


def docstrings(tree):
    """The string constants that are docstrings (module, class, function)."""
    out = set()
    for node in walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def kind_spellings(package=PACKAGE, owner="targets.py"):
    """'file:line: text' of every kind name spelled in code outside `owner` (the Kind definition): a string equal
    to a kind's value, or a pattern naming several kinds ("output|grad_output")."""
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.relative_to(package).as_posix() == owner:
            continue
        tree = parsed(path)
        skip = docstrings(tree)
        for node in walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in skip:
                continue
            parts = node.value.replace("(", "|").replace(")", "|").split("|")
            if node.value in KIND_VALUES or sum(p in KIND_VALUES for p in parts) >= 2:
                found.append(f"{path.relative_to(package.parent)}:{node.lineno}: {node.value!r}")
    return sorted(found, key=lambda f: (f.split(":")[0], int(f.split(":")[1])))


def test_kind_names_come_from_kind():
    """A target kind is spelled once, in targets.Kind: the others compare with Kind members and build patterns from
    KINDS, so a new kind touches targets.py and the hook that measures it."""
    from hookstats.targets import KINDS
    assert KINDS == KIND_VALUES
    found = kind_spellings()
    assert not found, "kind names spelled outside targets.Kind:\n" + "\n".join(found)


def test_the_kind_check_finds_a_spelled_kind(tmp_path):
    pkg = tmp_path / "hookstats"
    pkg.mkdir()
    (pkg / "targets.py").write_text("KINDS = ('output', 'param_grad')\n")
    (pkg / "a.py").write_text('"""About the output kind."""\nimport re\n'
                              "def f(k):\n    '''output'''\n    return k == 'param_grad' or k == 'outputs'\n"
                              "R = re.compile(r':(grad_output|output)$')\n")
    assert [f.split(": ", 1)[1] for f in kind_spellings(pkg)] == ["'param_grad'", "':(grad_output|output)$'"]


PHASE_VALUES = ("train", "eval")
# The files that may spell a phase: phases.py, which defines Phase (no other file needs to).
PHASE_OWNERS = ("phases.py",)


def phase_spellings(package=PACKAGE, owners=PHASE_OWNERS):
    """{file: ['line: text']} of every phase name spelled in code outside `owners`: a string equal to a phase's
    value, or quoting one ("phase must be 'train' or 'eval'"). Docstrings may name phases."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if rel in owners:
            continue
        tree = parsed(path)
        skip = docstrings(tree)
        for node in walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in skip:
                continue
            if node.value in PHASE_VALUES or any(repr(p) in node.value for p in PHASE_VALUES):
                found.setdefault(rel, []).append(f"{node.lineno}: {node.value!r}")
    return found


def test_phase_names_come_from_phase():
    """A phase is spelled in phases.py alone: the others compare with Phase members, take a record's phase with
    record_phase() (no phase: train) and a target's label with phase_label(), so a new phase touches one file."""
    from hookstats.phases import PHASES, Phase
    assert PHASES == PHASE_VALUES == tuple(Phase)
    found = phase_spellings()
    assert not found, "phase names spelled outside phases.py:\n" + "\n".join(
        f"{path}:{line}" for path, lines in found.items() for line in lines)


def test_the_phase_check_finds_a_spelled_phase(tmp_path):
    pkg = tmp_path / "hookstats"
    pkg.mkdir()
    (pkg / "phases.py").write_text("PHASES = ('train', 'eval')\n")
    (pkg / "a.py").write_text('"""The train phase."""\n'
                              "def f(p):\n    '''eval'''\n    return p == 'eval' or p == 'training'\n"
                              "def g(p):\n    raise ValueError(f\"phase must be 'train', got {p!r}\")\n")
    (pkg / "b.py").write_text("x = 'trainer'\n")
    assert phase_spellings(pkg) == {"a.py": ["4: 'eval'", "6: \"phase must be 'train', got \""]}


def names_used(tree):
    """Every name a file uses: plain names, attributes and imported names."""
    out = set()
    for node in walk(tree):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update(a.name.split(".")[-1] for a in node.names)
    return out


def files_using(names, package=PACKAGE):
    trees = {p.relative_to(package).as_posix(): parsed(p) for p in sorted(package.rglob("*.py"))}
    return {path for path, tree in trees.items() if names_used(tree) & set(names)}


def test_one_optimizer_hook_and_one_idea_of_what_an_optimizer_steps():
    """The step clock owns the monitor's optimizer hooks (registered in hooks/handles.py, asked for by the torch
    adapter at one place); parameter
    gradients and values listen to it (before_optimizer, after_optimizer), and which parameters an optimizer
    steps is read from its param_groups in clock.py alone."""
    registers = ("register_optimizer_step_pre_hook", "register_optimizer_step_post_hook", "register_step_pre_hook",
                 "register_step_post_hook")
    assert files_using(registers) == {"hooks/handles.py"}
    calls = [(p, node) for p in sorted(PACKAGE.rglob("*.py")) for node in walk(parsed(p))
             if isinstance(node, ast.Call) and dotted_tail(node.func) == "optimizer_hooks"]
    assert [p.relative_to(PACKAGE).as_posix() for p, _ in calls] == ["torch_adapter.py"]
    assert [ast.unparse(a) for a in calls[0][1].args] == ["clock.on_optimizer_pre_step", "clock.on_optimizer_step"]
    assert files_using(("param_groups",)) == {"clock.py"}


def dotted_tail(node):
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def test_the_step_rules_live_in_the_clock():
    """What the op does on a step (the device flags' values: measured, without histograms) and which steps count
    the histograms are decided in clock.py: the state owner only stores the values (set_modes). SKIP_HIST is
    otherwise read by the op (reference.py) and its timing (tools/op_speed.py); rawstate.py defines it and
    layout.py re-exports it; hist_every is reduced modulo in the clock alone."""
    assert files_using(("SKIP_HIST",)) == {"rawstate.py", "layout.py", "clock.py", "reference.py", "tools/op_speed.py"}
    modulo = set()
    for p in sorted(PACKAGE.rglob("*.py")):
        for node in walk(parsed(p)):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and "hist_every" in ast.unparse(node):
                modulo.add(p.relative_to(PACKAGE).as_posix())
    assert modulo == {"clock.py"}


# The compiled op: a module without Python source that imports nothing from hookstats.
EXTENSIONS = ("hookstats._C",)
# Engine modules and the tools: everything under hookstats/tools/ is a tool; the package's __init__ (which
# re-exports summary and plan) and __main__ (the command line's entry) sit between them.
TOOLS = "hookstats.tools"
ENTRY_POINTS = ("hookstats", "hookstats.__main__")
# Import cycles the package still has, each as the set of its modules: none (frameworks.py picks a model's adapter,
# and no adapter imports the attach() that asks it). Never add one.
KNOWN_CYCLES = []


def import_graph(package=PACKAGE, extensions=EXTENSIONS):
    """module -> set of the package's modules it imports, from every import statement (function-level ones too).
    `from a import b` is an import of module a.b when there is one, else of a."""
    paths = {module_name(p, package): p for p in sorted(package.rglob("*.py"))}
    known = set(paths) | set(extensions)
    graph = {}
    for name, path in paths.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        found = set()
        for node in walk(parsed(path)):
            if isinstance(node, ast.ImportFrom):
                base = here[:len(here) - node.level + 1] if node.level else []
                base = ".".join(base + ([node.module] if node.module else []))
                found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
        graph[name] = {m for m in found if m in known and m != name}
    for name in extensions:
        graph[name] = set()
    return graph


def import_cycles(graph):
    """The strongly connected components of more than one module (Tarjan), each a set of modules."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while not component or v not in component:
                component.add(stack.pop())
            on_stack.difference_update(component)
            if len(component) > 1:
                out.append(component)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_among_the_modules():
    graph = import_graph()
    cycles = import_cycles(graph)
    new = [sorted(c) for c in cycles if c not in KNOWN_CYCLES]
    assert not new, "modules that import each other (directly or around a loop):\n" + "\n".join(
        f"{c}: " + "; ".join(f"{m} -> {sorted(graph[m] & set(c))}" for m in c) for c in new)
    gone = [sorted(c) for c in KNOWN_CYCLES if c not in cycles]
    assert not gone, f"these cycles are gone: remove them from KNOWN_CYCLES: {gone}"


def folder_graph(graph, package="hookstats"):
    """The import graph with each subpackage (hookstats/sinks/, hookstats/tools/, ...) one node, the package's entry
    points left out: two files of two folders that import each other's folder around a loop are one cycle here."""
    def node(m):
        return ".".join(m.split(".")[:2])
    out = {}
    for m, targets in graph.items():
        if m in ENTRY_POINTS or m.split(".")[0] != package:
            continue
        out.setdefault(node(m), set()).update(node(t) for t in targets if t not in ENTRY_POINTS and node(t) != node(m))
    for targets in list(out.values()):
        for t in targets:
            out.setdefault(t, set())
    return out


def test_no_import_cycle_among_the_folders():
    """No back-and-forth between a module and a folder (distributed.py and sinks/ share the rank through ranks.py)."""
    graph = folder_graph(import_graph())
    cycles = import_cycles(graph)
    assert not cycles, "folders and modules that import each other:\n" + "\n".join(
        "; ".join(f"{m} -> {sorted(graph[m] & c)}" for m in sorted(c)) for c in cycles)


def test_the_folder_cycle_check_finds_a_loop(tmp_path):
    """distributed.py importing sinks/base.py while sinks/claim.py imports distributed.py is no module cycle, but
    a folder one; the package's __init__ importing what imports it is neither."""
    pkg = tmp_path / "hookstats"
    (pkg / "sinks").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .distributed import reduce\n")
    (pkg / "distributed.py").write_text("def reduce():\n    from .sinks.base import check\n")
    (pkg / "sinks" / "__init__.py").write_text("")
    (pkg / "sinks" / "base.py").write_text("def check():\n    pass\n")
    (pkg / "sinks" / "claim.py").write_text("import hookstats\nfrom ..distributed import reduce\n")
    graph = import_graph(pkg)
    assert import_cycles(graph) == []
    assert import_cycles(folder_graph(graph)) == [{"hookstats.distributed", "hookstats.sinks"}]
    (pkg / "sinks" / "claim.py").write_text("import hookstats\n")
    assert import_cycles(folder_graph(import_graph(pkg))) == []


def test_the_engine_never_imports_the_tools():
    found = [f"{m} -> {sorted(t for t in targets if t.startswith(TOOLS))}" for m, targets in import_graph().items()
             if not m.startswith(TOOLS) and m not in ENTRY_POINTS and any(t.startswith(TOOLS) for t in targets)]
    assert not found, "engine modules that import hookstats.tools:\n" + "\n".join(found)


def test_the_cycle_check_finds_a_loop(tmp_path):
    """The scan itself: a loop through a function-level import, `from . import x`, an absolute import and a
    subpackage's `from .. import` is one cycle; an import of the compiled extension or of a module's own
    package's name is not an edge back."""
    pkg = tmp_path / "hookstats"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import f\n")
    (pkg / "a.py").write_text("from . import b\ndef f():\n    from . import _C\n    return b\n")
    (pkg / "b.py").write_text("def g():\n    import hookstats.sub.c\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("from .. import a\n")
    (pkg / "leaf.py").write_text("from hookstats import a\n")
    graph = import_graph(pkg)
    assert graph["hookstats.a"] == {"hookstats.b", "hookstats._C"} and graph["hookstats"] == {"hookstats.a"}
    assert import_cycles(graph) == [{"hookstats.a", "hookstats.b", "hookstats.sub.c"}]
    (pkg / "b.py").write_text("")
    assert import_cycles(import_graph(pkg)) == []


# ---- `import hookstats` stays light: the tools load when first used ----
HEAVY = ("hookstats.tools", "torch.utils.flop_counter", "matplotlib")  # the tools, the planner's FLOP counter, charts


def loaded_after(code):
    """The HEAVY modules (and their submodules) in sys.modules after `code` runs in a fresh interpreter."""
    probe = (f"import sys\n{code}\n"
             f"print(sorted(m for m in sys.modules if any(m == h or m.startswith(h + '.') for h in {HEAVY!r})))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return ast.literal_eval(out.stdout.strip().splitlines()[-1])


def test_import_hookstats_loads_no_tool():
    """A training script's `import hookstats` (and attach) imports neither the planner nor the summary nor the
    charts; hookstats.plan and hookstats.summary load them when first used."""
    assert loaded_after("import hookstats\nhookstats.attach, hookstats.Monitor, hookstats.Phase") == []
    used = loaded_after("import hookstats\nfrom hookstats import summary\nhookstats.plan")
    assert {"hookstats.tools.planner", "hookstats.tools.summary", "torch.utils.flop_counter"} <= set(used)
