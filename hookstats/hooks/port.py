"""What the hooks of one monitor are given at attach time (fastai's shape: a hook holds the handles it needs,
not a back-pointer to a monitor): the state owner, the step clock, the calls of the running forward and
one-time warnings; and what compiled code leaves to settle at the next eager point."""
import torch

from ..clock import in_recompute
from ..compile_fallback import CheckpointFallback
from ..phases import phase_label
from ..tensors import measured, unread_reason
from .calls import Calls
from .grad_taps import ViewTaps


class Port:
    def __init__(self, store, clock, tell, separate_calls):
        self.store, self.clock, self.tell = store, clock, tell
        self.calls = Calls(separate_calls)
        self.view_taps = ViewTaps()  # gradient taps on view outputs, checked for in-place ops
        self.untapped = False  # a gradient tap was left out of compiled code (grad_taps.COMPILED_GRAD_TAPS)
        self.checkpoint_fallback = CheckpointFallback()

    def measure_in(self, key, t, phase, keep=False, compiling=None, table=None):
        """Measures t into key's state. keep (eager code only): returns the op's bound arguments (StateStore.bound)
        when t itself was measured, for the hook to keep and pass to StateStore.update next time; else None.
        compiling, table: as StateStore.resolve takes them."""
        x = measured(t)
        if x is not None:
            target = self.store.resolve(key, x.device, phase, compiling=compiling, table=table)
            if target is not None:
                self.store.accumulate(x, *target)
                if x is not t:  # a DTensor read through its shard (never inside compiled code: measured() is t)
                    self.store.note_placement(key, t)
                elif keep:
                    return self.store.bound(*target)
        elif (why := unread_reason(t)) is not None:
            self.tell(f"unread:{key.id}", f"hookstats: {key.id} is {why}: it is not measured")
        return None

    def settle(self):
        """An eager point (StepClock.eager_listeners): allocates what compiled code reached first, says once what
        torch.compile changes (a checkpointed region it ran eagerly too) and which view outputs lost their gradient."""
        self.view_taps.settle(self.tell)
        self.checkpoint_fallback.settle(self.clock.compiled, self.tell)
        late = self.store.allocate_late()
        if late:
            ids = list(dict.fromkeys(phase_label(k[1].id, k[0]) for k in late))
            self.tell(("late", *ids), f"hookstats: {len(ids)} target(s) ({', '.join(ids)}) were first reached "
                              "inside torch.compile, where their state cannot be allocated; they are allocated now "
                              "and measured from the next call on (one recompile). Run one eager step before "
                              "compiling to measure them from the start.")
        if self.untapped:
            self.tell("untapped", f"hookstats: torch {torch.__version__} cannot compile hooks on gradients that "
                                  "update hookstats' state (fixed in torch 2.13): inside torch.compile, gradients "
                                  "flowing into outputs and watched tensors are not measured (grad_output, "
                                  "watch_grad); forward values and parameter gradients are.")


def recomputing(compiling=None):
    if compiling is None:
        compiling = torch.compiler.is_compiling()
    return not compiling and in_recompute()
