"""The calls of the running forward: the order in which hooked modules are first reached, and with
separate_calls=True the index of each call ("fc:output@1"), kept per thread, and the calls run without grad
(reentrant checkpointing)."""
import threading

import torch


class CallStacks:
    """What each running call of a module left open, a stack per thread: nested calls (a module calling itself)
    stack up, and a call ending in one thread never closes another thread's call. Compiled code is traced
    as one thread."""

    def __init__(self):
        self.stacks = {}  # thread id -> [item of each open call, innermost last]

    def push(self, item):
        tid = thread_id()
        stack = self.stacks.get(tid)
        if stack is None:  # not setdefault: torch 2.4's Dynamo breaks the graph on it
            stack = self.stacks[tid] = []
        stack.append(item)

    def pop(self):
        stack = self.stacks.get(thread_id())
        if not stack:
            return None
        item = stack.pop()
        if not stack:
            del self.stacks[thread_id()]
        return item

    def top(self):
        stack = self.stacks.get(thread_id())
        return stack[-1] if stack else None

    def clear(self):
        self.stacks.clear()

    def __bool__(self):
        return bool(self.stacks)


def thread_id():
    return 0 if torch.compiler.is_compiling() else threading.get_ident()


class CallIndex:
    """separate_calls=True: the index of each call of a module in the current forward, given when the call
    starts (a pre-hook registered before the others) and dropped when it ends (a forward hook registered
    after the others, run even if the forward raises), so every kind of target of one call, and calls
    nested in it (a module that calls itself), agree on "@k". Outside the root model's forward, a call
    that is not nested in another call of the module starts again from 0: a submodule driven on its own."""

    def __init__(self, clock, name):
        self.clock, self.name = clock, name
        self.count = 0
        self.running = CallStacks()

    def pre_hook(self, module, args):
        if not self.running and not torch.compiler.is_compiling() and self.clock.root_running == 0:
            self.count = 0
        self.running.push(self.count)
        self.count += 1

    def forward_hook(self, module, args, out):
        self.running.pop()

    def reset(self):
        self.count = 0
        self.running.clear()

    def current(self):
        return self.running.top()


class Calls:
    """Per root forward: the call index of each module (separate_calls), the count of each watch name's
    calls, and the names called without grad; across forwards, the forward order of first calls."""

    def __init__(self, separate):
        self.separate = separate
        self.index = {}  # module name -> CallIndex (separate_calls)
        self.forward_order = {}  # module or watch name -> rank of its first eager forward call (alerts' order)
        self.gradless = set()  # names called without grad (reentrant checkpointing's forward), separate_calls
        self.watch_calls = {}  # watch name -> its calls so far in this forward (separate_calls)

    def new_forward(self):
        self.watch_calls.clear()
        self.gradless.clear()
        for index in self.index.values():
            index.reset()  # a forward that raised leaves its calls open

    def saw(self, name, compiling=None):
        """Records the order in which the forward first reaches each hooked module (eager code only)."""
        # asked first: compiled code would specialize on the name it looks up (a graph per block compiled alone)
        if not (torch.compiler.is_compiling() if compiling is None else compiling) and name not in self.forward_order:
            self.forward_order[name] = len(self.forward_order)

    def call_of(self, name):
        """The index of the running call of module `name` in this forward, or None when calls share one state."""
        index = self.index.get(name) if self.separate else None
        return None if index is None else index.current()

    def next_watch_call(self, name):
        """The index of this mon.watch(name, ...) call in the current forward, or None when calls share one state."""
        if not self.separate:
            return None
        n = self.watch_calls.get(name, 0)
        self.watch_calls[name] = n + 1
        return n

    def skip_recomputed(self, name, recompute, tell):
        """separate_calls=True: a call recomputed by activation checkpointing cannot be matched to its index in
        the original forward, so it is skipped (True). Non-reentrant checkpointing loses nothing by that (its
        gradients reach the forward's taps); reentrant checkpointing ran the forward without grad, which is
        noted here, so the loss of its gradients is said once."""
        if not recompute:
            if not torch.is_grad_enabled():
                self.gradless.add(name)
            return False
        if name in self.gradless:
            tell("recompute_calls", "hookstats: with separate_calls=True, gradients flowing through segments "
                                    "recomputed by activation checkpointing (use_reentrant=True) are not "
                                    "measured: a recomputed call cannot be matched to its index")
        return True
