"""Which modules attach() hooks: select_modules (names, glob patterns, types, exclude; by default every module
with parameters of its own) and how targets name them (module_names)."""
import fnmatch

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
    for what, pats in (("modules", modules), ("exclude", exclude)):
        if pats is None:
            continue
        if isinstance(pats, str):
            raise ValueError(f"{what} must be a list of names or glob patterns, not a string: {pats!r}")
        for p in pats:
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
    if not out:
        raise ValueError(f"no {noun} selected: check modules=, types= and exclude=")
    return out
