"""Which Paddle layers attach() hooks: the rules of hookstats.selection on Paddle's named_sublayers() names."""
import fnmatch

import paddle


def own_params(layer):
    return next(iter(layer.parameters(include_sublayers=False)), None) is not None


def layer_names(layer):
    """name -> layer as targets name them: named_sublayers(include_self=True), the root (named "" there) named
    after its class ("MLP:output"; "MLP_root" if a sublayer has that name)."""
    named = dict(layer.named_sublayers(include_self=True))
    root = type(layer).__name__
    root = root if root not in named else f"{root}_root"
    return {(n or root): m for n, m in named.items()}


def select_layers(layer, modules=None, types=None, exclude=None, include_paramless=False):
    """name -> layer. Default: every layer with parameters of its own. modules: names or glob patterns (the
    root layer also matches ""); types: paddle.nn.Layer subclasses; exclude: names or glob patterns."""
    named = layer_names(layer)
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
                raise ValueError(f"{what}: no layer of the model matches {p!r}; layers are e.g. {list(named)[:8]}")
    if types is not None:
        types = tuple(types) if isinstance(types, (list, tuple)) else (types,)
        if not all(isinstance(t, type) and issubclass(t, paddle.nn.Layer) for t in types):
            raise ValueError(f"types must be paddle.nn.Layer subclasses, got {types!r}")
    out = {}
    for name, m in named.items():
        if modules is not None:
            if not any(matches(name, p) for p in modules):
                continue
        elif types is None and not (include_paramless or own_params(m)):
            continue
        if types is not None and not isinstance(m, types):
            continue
        if exclude is not None and any(matches(name, p) for p in exclude):
            continue
        out[name] = m
    if not out:
        raise ValueError("no layer selected: check modules=, types= and exclude=")
    return out
