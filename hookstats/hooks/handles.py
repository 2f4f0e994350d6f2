"""How hookstats registers its hooks: module hooks that a module's copies do not inherit (ModuleHook,
CopiedAway), and global optimizer / parameter hooks that hold their monitor weakly."""
import functools
import weakref

from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook


class CopiedAway:
    """What a monitored model's copy holds where the original holds a hookstats hook: a hook that does nothing.
    copy.deepcopy (EMA, torch.optim.swa_utils.AveragedModel) and pickle (torch.save) copy a module's hook
    dicts; a copy must not feed the original's monitor, nor drag the monitor along."""

    def __call__(self, *args, **kwargs):
        return None


class ModuleHook(functools.partial):
    """A module hook of hookstats: calls its function; copied or pickled with its module, it becomes a
    CopiedAway. A partial, not a class with __call__: its call adds no Python frame, so torch.compile sees
    each hook's own function (one shared __call__ would recompile for every hook it met)."""

    def __deepcopy__(self, memo):
        return CopiedAway()

    def __reduce__(self):
        return CopiedAway, ()


def hook_module(module, fn, pre=False, **kwargs):
    """module.register_forward_(pre_)hook(fn) that the module's copies do not inherit (see CopiedAway)."""
    register = module.register_forward_pre_hook if pre else module.register_forward_hook
    return register(ModuleHook(fn), **kwargs)


_weak_hooks = []  # (weak method, handle): hooks of monitors that may be gone


def weakly(method, register):
    """register(hook) where the hook calls a bound method through a weak reference: global optimizer
    hooks and parameter hooks (held outside Python's cycle collector) must not keep a forgotten monitor,
    and its model, alive. A dead one does nothing and is removed at the next registration, never from
    inside the hook: PyTorch is iterating the hook dict then."""
    alive = []
    for r, h in _weak_hooks:
        if r() is None:
            h.remove()
        else:
            alive.append((r, h))
    ref, fn = weakref.ref(method.__self__), method.__func__  # not a WeakMethod: Dynamo cannot trace its call

    def hook(*args):
        obj = ref()
        return None if obj is None else fn(obj, *args)

    handle = register(hook)
    _weak_hooks[:] = alive + [(ref, handle)]
    return handle


def optimizer_hooks(pre, post):
    """The global torch.optim step pre- and post-hook of one monitor, its step clock's methods (held weakly):
    whatever else listens to optimizer steps listens to the clock."""
    return [weakly(pre, register_optimizer_step_pre_hook), weakly(post, register_optimizer_step_post_hook)]
