"""The API reference speaks to users: attach() gives every parameter of its signature an entry of its own (name,
type, default, what it does) that napoleon renders as one field each, and Monitor's entry and members say what
they do for the user, not which of hookstats' files use them."""
import inspect
import re

import pytest
from sphinx.ext.napoleon import Config
from sphinx.ext.napoleon.docstring import NumpyDocstring

import hookstats
from hookstats import monitor

SIGNATURE = inspect.signature(monitor.attach).parameters


def entries(doc):
    """{name: entry header and text} of the numpy-style Parameters section of a docstring."""
    section = re.search(r"^Parameters\n-+\n(.*?)(?:^\S[^\n]*\n-+\n|\Z)", inspect.cleandoc(doc), re.S | re.M).group(1)
    out, name = {}, None
    for line in section.splitlines():
        if line and not line[0].isspace():
            name, _, kind = line.partition(" : ")
            out[name] = [kind]
        elif name is not None:
            out[name].append(line.strip())
    return {n: "\n".join(v) for n, v in out.items()}


def shown_name(p):
    return ("**" if p.kind is p.VAR_KEYWORD else "*" if p.kind is p.VAR_POSITIONAL else "") + p.name


def test_every_parameter_of_attach_has_its_own_entry_in_signature_order():
    got = entries(hookstats.attach.__doc__)
    assert list(got) == [shown_name(p) for p in SIGNATURE.values()]
    for name, text in got.items():
        assert text.split("\n", 1)[-1].strip(), f"attach's entry for {name} says nothing"


@pytest.mark.parametrize("p", [p for p in SIGNATURE.values() if p.default is not inspect.Parameter.empty],
                         ids=lambda p: p.name)
def test_each_entry_states_the_signatures_default(p):
    header = entries(hookstats.attach.__doc__)[p.name].split("\n")[0]
    if p.default is None:
        assert "optional" in header or "default" not in header, header
    else:
        said = re.search(r"default (.+)$", header)
        assert said, f"{p.name}: {header!r} gives no default"
        assert said.group(1).strip('"') == str(p.default), (p.name, said.group(1), p.default)


def test_napoleon_renders_one_field_per_parameter():
    rendered = str(NumpyDocstring(inspect.cleandoc(hookstats.attach.__doc__), Config(napoleon_use_param=True)))
    fields = re.findall(r"^:param ([\w*\\]+):", rendered, re.M)
    assert fields == [shown_name(p).replace("*", r"\*") for p in SIGNATURE.values()], fields


def members():
    """Monitor's public methods and properties: what the reference's autoclass shows once documented."""
    return [n for n, v in vars(hookstats.Monitor).items() if not n.startswith("_")
            and (inspect.isfunction(v) or isinstance(v, property))]


@pytest.mark.parametrize("name", ["Monitor"] + members())
def test_monitor_entries_are_written_for_users(name):
    obj = hookstats.Monitor if name == "Monitor" else vars(hookstats.Monitor)[name]
    doc = obj.__doc__ or ""
    assert doc.strip(), f"Monitor.{name} has no docstring: the reference leaves it out"
    internals = re.findall(r"\b\w+\.py\b|StateStore|TargetState|StepClock|\bmon\.(?:store|clock|port|hooks)\b|"
                           r"\bring\b|History needs", doc)
    assert not internals, f"Monitor.{name} speaks of hookstats' internals: {internals}"
