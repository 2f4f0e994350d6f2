"""Dynamo's graph breaks on side effects inside a higher-order op's subgraph (activation checkpointing inside the
compiled region): the hooks' Python state (states marked reached, targets noted for allocation) is such a side
effect, and Dynamo then runs that region eagerly. Counted from torch._dynamo's own counters, read at eager points."""
import sys

FIX = ("torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = True before the first compiled call "
       "(hookstats' hooks skip the recomputed forward, so nothing of theirs needs replaying), or run one eager "
       "training step before compiling (enough at the defaults, not with input_grads=True)")


def hop_side_effect_breaks():
    """How many graph breaks Dynamo has counted on a side effect inside a higher-order op's subgraph so far; 0 when
    Dynamo was never imported (nothing was compiled)."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if not counters or "graph_break" not in counters:
        return 0
    return sum(n for reason, n in counters["graph_break"].items() if is_hop_side_effect(reason))


def is_hop_side_effect(reason):
    """Dynamo's reason for such a break: torch 2.13 says "HOP: Non-nullified side effect" (an attribute) or "HOP:
    Unsafe side effect" (a dict), older ones "HigherOrderOperator: Mutating a variable not in the current scope"."""
    lower = reason.lower()
    return ("HOP" in reason or "HigherOrderOperator" in reason) and ("side effect" in lower or "mutating" in lower)


class CheckpointFallback:
    """Says once, at an eager point after compiled code ran, that a checkpointed region ran eagerly since attach."""

    def __init__(self):
        self.before = hop_side_effect_breaks()  # another model's breaks before attach are not this monitor's
        self.told = False

    def settle(self, compiled, tell):
        if self.told or not compiled or hop_side_effect_breaks() <= self.before:
            return
        self.told = True
        tell("checkpoint_eager", "hookstats: torch.compile ran an activation-checkpointed region eagerly (a graph "
                                 "break on a side effect inside the checkpoint's subgraph: hookstats' hooks set "
                                 f"Python state there), so that forward is not compiled. Set {FIX}.")
