"""Which Paddle layers attach() hooks: the rules of hookstats.selection on Paddle's named_sublayers() names."""
import paddle

from ..selection import select


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
    return select(layer_names(layer), modules, types, exclude, include_paramless, own_params, paddle.nn.Layer,
                  "paddle.nn.Layer", "layer")
