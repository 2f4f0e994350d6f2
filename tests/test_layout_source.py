"""csrc/state_layout.def is the one source of the state layout: the C++ header compiles its rows (a small program
built with csrc/accumulator.h prints what the compiler made of them) and hookstats/rawstate.py parses them, and the
two agree on every constant and every istate offset; a layout that changes without a new HS_LAYOUT_VERSION fails
here, since JSONL run headers and checkpoints name that version alone."""
import hashlib
import importlib
import json
import os
import shutil
import subprocess
import sys

import pytest

from hookstats import layout, rawstate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEF = os.path.join(ROOT, "csrc", rawstate.LAYOUT_FILE)
NBINS = (1, 7, 40, rawstate.MAX_BINS)

# Each layout version's digest (layout_digest). A new layout: raise HS_LAYOUT_VERSION in csrc/state_layout.def and
# add its line here; an old line never changes, since files and checkpoints of that version exist.
KNOWN_LAYOUTS = {1: "b44fc091d569c6a7"}


def described(rs):
    """What a saved slot means under rawstate module `rs`: every constant but the version, the float buckets'
    numbering, and each field's part, rules and slots for every flag combination."""
    return {"constants": {k: v for k, v in rs.CONSTANTS.items() if k != "LAYOUT_VERSION"},
            "float": [rs.FLOAT_SHIFT, rs.FLOAT_HALF, rs.FLOAT_SLOTS, rs.FLOAT_BELOW, rs.FLOAT_ABOVE, rs.FLOAT_ZERO],
            "fields": [[fd.name, fd.part, fd.merge, fd.step, [fd.slots(n, f) for n in NBINS for f in range(16)]]
                       for fd in rs.FIELDS]}


def layout_digest(rs):
    return hashlib.sha256(json.dumps(described(rs), sort_keys=True).encode()).hexdigest()[:16]


def version_problem(rs):
    """None when `rs`'s layout is the one its LAYOUT_VERSION names in KNOWN_LAYOUTS, else what to do."""
    version, digest = rs.LAYOUT_VERSION, layout_digest(rs)
    if KNOWN_LAYOUTS.get(version) == digest:
        return None
    if version in KNOWN_LAYOUTS:
        return (f"the state layout changed but HS_LAYOUT_VERSION is still {version}: raise it in csrc/state_layout.def "
                f"and add {version + 1}: {digest!r} to KNOWN_LAYOUTS")
    return f"layout version {version} is new: add {version}: {digest!r} to KNOWN_LAYOUTS"


def rawstate_over(text, tmp_path, monkeypatch):
    """A fresh copy of rawstate.py whose state_layout.def is `text`: imported as probe.rawstate from tmp_path, beside
    a stand-in for the package's _build that finds the sources there."""
    pkg = tmp_path / "probe"
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "_build.py").write_text(f"def source_dir():\n    return {str(pkg)!r}\n")
    with open(rawstate.__file__, encoding="utf-8") as f:
        (pkg / "rawstate.py").write_text(f.read())
    here = os.path.dirname(rawstate.__file__)
    shutil.copyfile(os.path.join(here, "tensor_kind.py"), pkg / "tensor_kind.py")  # rawstate imports it
    (pkg / rawstate.LAYOUT_FILE).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("probe", "probe._build", "probe.tensor_kind", "probe.rawstate"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return importlib.import_module("probe.rawstate")


def def_text():
    with open(DEF, encoding="utf-8") as f:
        return f.read()


def test_the_layout_is_the_one_its_version_names():
    assert version_problem(rawstate) is None, version_problem(rawstate)
    assert len(set(KNOWN_LAYOUTS.values())) == len(KNOWN_LAYOUTS)


@pytest.mark.parametrize("old,new", [("HS_CONST(FloatMantBits, 3)", "HS_CONST(FloatMantBits, 4)"),
                                     ("HS_COUNTER(NearZero)", "HS_COUNTER(NearZero)\nHS_COUNTER(Probe)"),
                                     ("HS_FLAG(LogHist, 2)", "HS_FLAG(LogHist, 16)")])
def test_a_layout_change_without_a_new_version_is_caught(tmp_path, monkeypatch, old, new):
    text = def_text()
    assert old in text
    v = rawstate.LAYOUT_VERSION
    changed = rawstate_over(text.replace(old, new), tmp_path, monkeypatch)
    assert f"HS_LAYOUT_VERSION is still {v}: raise it" in version_problem(changed)
    bumped = rawstate_over(text.replace(old, new).replace(f"HS_LAYOUT_VERSION({v})", f"HS_LAYOUT_VERSION({v + 1})"),
                           tmp_path, monkeypatch)
    assert bumped.LAYOUT == {**changed.LAYOUT, "version": v + 1}
    assert version_problem(bumped) == \
        f"layout version {v + 1} is new: add {v + 1}: {layout_digest(bumped)!r} to KNOWN_LAYOUTS"


def test_a_new_counter_is_one_row(tmp_path, monkeypatch):
    """A counter row adds its field (one int64 slot, summed, its growth per step) after the others, and every
    histogram moves up one slot."""
    last = rawstate.ROWS["COUNTER"][-1][0]
    text = def_text().replace(f"HS_COUNTER({last})", f"HS_COUNTER({last})\nHS_COUNTER(ProbeCount)")
    rs = rawstate_over(text, tmp_path, monkeypatch)
    fd = rs.BY_NAME["probe_count"]
    assert (fd.part, fd.merge, fd.step, fd.empty) == (rs.ISTATE, rs.SUM, rs.GROWTH, 0)
    assert rs.COUNTERS == {**rawstate.COUNTERS, "probe_count": rawstate.LIN_BASE}
    assert rs.LIN_BASE == rawstate.LIN_BASE + 1
    for flags in range(16):
        assert fd.slots(7, flags) == (rawstate.LIN_BASE, 1)
        assert rs.istate_size(7, flags) == rawstate.istate_size(7, flags) + 1


def cxx_layout(tmp_path):
    exe = tmp_path / "layout_dump"
    cxx = os.environ.get("CXX", "g++")
    r = subprocess.run([cxx, "-std=c++17", "-Wall", "-Werror", f"-I{os.path.join(ROOT, 'csrc')}",
                        os.path.join(ROOT, "tests", "layout_dump.cpp"), "-o", str(exe)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout)


def test_cpp_and_python_read_the_same_layout(tmp_path):
    cxx = cxx_layout(tmp_path)
    rows = cxx["rows"]
    fslots = [name for name, _, _ in rawstate.ROWS["FSLOT"]]
    assert {rawstate.snake_case(n): rows.pop(n) for n in fslots} == \
        {fd.name: fd.slots(0, 0)[0] for fd in rawstate.FSTATE_FIELDS}
    assert {rawstate.snake_case(n).upper(): v for n, v in rows.items()} == \
        {k: v for k, v in rawstate.CONSTANTS.items() if k != "LIN_BASE"}
    d = cxx["derived"]
    assert (d["FState"], d["LinBase"], d["HistFlags"]) == (rawstate.FSTATE_SIZE, rawstate.LIN_BASE, rawstate.HIST_FLAGS)
    assert [d[k] for k in ("FloatShift", "FloatHalf", "FloatSlots", "FloatBelow", "FloatAbove", "FloatZero")] == \
        [rawstate.FLOAT_SHIFT, rawstate.FLOAT_HALF, rawstate.FLOAT_SLOTS, rawstate.FLOAT_BELOW, rawstate.FLOAT_ABOVE,
         rawstate.FLOAT_ZERO]
    assert cxx["offsets"] == [[n, f, *layout.offsets(n, f)] for n in NBINS for f in range(16)]


def test_a_row_the_parser_cannot_read_is_one_clear_error():
    with pytest.raises(ValueError, match=r"state_layout.def:2: not a layout row: 'HS_CONST\(LogSlots 256'"):
        rawstate.read_layout("HS_CONST(LinExtra, 5)  // five\nHS_CONST(LogSlots 256\n")
    assert rawstate.read_layout("#ifndef X\n// c\nHS_FLAG(LogHist, 2)\nHS_CONST(LogExpMin, -126)\n") == \
        {"FLAG": [["LogHist", 2]], "CONST": [["LogExpMin", -126]]}


def test_rawstate_reads_the_layout_where_the_build_finds_the_sources():
    """csrc/ in a clone (hookstats/_csrc/ in a wheel: tests/test_install.py checks that it carries all of csrc/)."""
    assert os.path.samefile(rawstate.LAYOUT_PATH, DEF)
