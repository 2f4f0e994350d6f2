"""The monitor attached to each model (summary() and plan() find it; attach() warns on a second one): held weakly, so
neither a model nor its monitor is kept alive by it."""
import weakref

_attached_to = weakref.WeakKeyDictionary()  # model -> weakref of its last attached monitor


def remember(model, mon):
    """mon is the monitor attached to `model` last."""
    _attached_to[model] = weakref.ref(mon)


def forget(model, mon):
    """mon is removed: `model` has no attached monitor, unless a later one is attached."""
    ref = _attached_to.get(model)
    if ref is not None and ref() is mon:
        del _attached_to[model]


def attached_monitor(model):
    """The monitor last attached to `model` and not removed yet, or None."""
    ref = _attached_to.get(model)
    mon = ref() if ref is not None else None
    return mon if mon is not None and mon.attached else None
