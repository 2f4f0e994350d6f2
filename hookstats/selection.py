"""Which modules attach() hooks: select_modules (names, glob patterns, types, exclude; by default every module
with parameters of its own) and how targets name them (module_names)."""
import fnmatch
from collections.abc import Iterable

from torch import nn


def own_params(m):
    return next(m.parameters(recurse=False), None) is not None


def module_names(model):
    """name -> module as targets are named: named_modules(), except that the root model, named "" there, is
    named after its class ("GPT2Model:output"; "GPT2Model_root" if a submodule has that name)."""
    named = dict(model.named_modules())
    root = type(model).__name__
    root = root if root not in named else f"{root}_root"
    return {(n or root): m for n, m in named.items()}


def check_patterns(what, pats):
    """modules= / exclude=: None, or a list (tuple, set, generator) of str names or glob patterns, as a list."""
    if pats is None:
        return None
    if isinstance(pats, str):
        raise ValueError(f"{what} must be a list of names or glob patterns, not a string: {pats!r}")
    if isinstance(pats, (bytes, dict)) or not isinstance(pats, Iterable):
        raise ValueError(f"{what} must be a list of module names or glob patterns (str), "
                         f"got {type(pats).__name__} {pats!r:.80}")
    pats = list(pats)
    for i, p in enumerate(pats):
        if not isinstance(p, str):
            raise ValueError(f"{what}[{i}] must be a module name or glob pattern (a str), got {type(p).__name__} {p!r:.80}")
    return pats


def select_modules(model, modules=None, types=None, exclude=None, include_paramless=False):
    """name -> module (module_names). Default: every module with parameters of its own (fastai's rule).
    modules: names or glob patterns (the root model also matches ""); types: module classes; exclude: names
    or glob patterns."""
    return select(module_names(model), modules, types, exclude, include_paramless, own_params, nn.Module,
                  "nn.Module", "module")


def select(named, modules, types, exclude, include_paramless, has_params, base, base_name, noun):
    """The selection rules on {name: module} of any framework (the root first): base is its module class,
    has_params(m) whether m has parameters of its own, noun what the framework calls a module."""
    root = next(iter(named))

    def matches(name, pat):
        return fnmatch.fnmatchcase(name, pat) or pat == "" and name == root
    modules, exclude = check_patterns("modules", modules), check_patterns("exclude", exclude)
    for what, pats in (("modules", modules), ("exclude", exclude)):
        for p in pats or ():
            if not any(matches(n, p) for n in named):
                raise ValueError(f"{what}: no {noun} of the model matches {p!r}; "
                                 f"{noun}s are e.g. {list(named)[:8]}")
    if types is not None:
        types = tuple(types) if isinstance(types, (list, tuple)) else (types,)
        if not all(isinstance(t, type) and issubclass(t, base) for t in types):
            raise ValueError(f"types must be {base_name} subclasses, got {types!r}")
    out = {}
    for name, m in named.items():
        if modules is not None:
            if not any(matches(name, p) for p in modules):
                continue
        elif types is None and not (include_paramless or has_params(m)):
            continue
        if types is not None and not isinstance(m, types):
            continue
        if exclude is not None and any(matches(name, p) for p in exclude):
            continue
        out[name] = m
    if not out and modules is None and types is None and not include_paramless:
        raise ValueError(f"no {noun} selected: no {noun} of the model has parameters of its own; pass "
                         f"include_paramless=True to measure {noun}s without parameters")
    if not out:
        raise ValueError(f"no {noun} selected: check modules=, types= and exclude=")
    return out
