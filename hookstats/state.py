"""The one owner of the device state: what a target is (TargetKey, Kind), its buffers (allocated once, updated in
place by the fused op), the device-side sampling flags, states first reached inside compiled code, host reads and
the bytes it all holds."""
import contextlib
import dataclasses
import enum
import threading

import torch

from . import accumulate, layout, rawstate
from .phases import PHASES, Phase  # noqa: F401 (what a state is measured in, beside Kind)
from .tensors import placement_of


class Kind(str, enum.Enum):
    """What a target measures. A str that prints, formats, hashes and reprs as its plain value, so ids
    ("fc1:output"), records, stats(kind="output") and saved files read as plain strings did, and a key made
    with "output" finds the state of Kind.OUTPUT."""
    OUTPUT = "output"
    GRAD_OUTPUT = "grad_output"
    INPUT = "input"
    GRAD_INPUT = "grad_input"
    PARAM_GRAD = "param_grad"
    PARAM = "param"
    WATCH = "watch"
    WATCH_GRAD = "watch_grad"

    __str__ = str.__str__
    __repr__ = str.__repr__
    __format__ = str.__format__
    __hash__ = str.__hash__


KINDS = tuple(k.value for k in Kind)
# When a step reaches each kind: forward ones in this order within a module, those read at the optimizer step last,
# the others (gradients, parameter values) in backward order (alerts.step_order)
FORWARD_KINDS = (Kind.INPUT, Kind.OUTPUT, Kind.WATCH)
OPTIMIZER_KINDS = (Kind.PARAM_GRAD,)


@dataclasses.dataclass(frozen=True)
class TargetKey:
    """What one state measures: `module` (module, parameter or watched tensor name), `kind` (a Kind: output,
    grad_output, input, grad_input, param_grad, param, watch, watch_grad), `leaf` (the path of the tensor inside a
    tuple/dict output, "" for a plain tensor) and `call` (the call's index in the step with
    separate_calls=True, else None: every call of a module goes to one state)."""
    module: str
    kind: Kind
    leaf: str = ""
    call: int = None

    @property
    def id(self):
        return f"{self.module}:{self.kind}{self.leaf}" + ("" if self.call is None else f"@{self.call}")


class TargetState:
    """The running state of one target in one phase on one device. Allocated once, updated in place."""

    __slots__ = ("key", "phase", "fstate", "istate", "scratch", "reached", "closed_f")

    def __init__(self, key, phase, device, cfg):
        self.key, self.phase = key, phase
        self.reached = False  # preallocated states no hook ever reached are left out of stats()
        self.fstate, self.istate = rawstate.empty(cfg.istate_size, device=device)
        self.scratch = torch.zeros(scratch_bytes(device), dtype=torch.uint8, device=device)
        for t in (self.fstate, self.istate, self.scratch):
            mark_static(t)
        # With a per-step history, the op's fstate holds the open step only and closed_f the steps before
        # it (merged in at each step end), so a step's moments never come from subtracting running totals.
        self.closed_f = None

    def split_steps(self):
        if self.closed_f is None:
            self.closed_f = self.fstate.clone()
            self.fstate.copy_(rawstate.empty(device=self.fstate.device))

    def total_fstate(self):
        """The running fstate since attach or reset(), on the device."""
        return self.fstate if self.closed_f is None else rawstate.combine(self.closed_f, self.fstate)

    def load(self, total_f, istate):
        """Makes the running totals those of a checkpoint (checkpoint.py), with no open step."""
        order([self])
        if self.closed_f is None:
            self.fstate.copy_(total_f)
        else:
            self.closed_f.copy_(total_f)
            self.fstate.copy_(rawstate.empty(device=self.fstate.device))
        self.istate.copy_(istate)
        self.reached = True

    def reset(self):
        self.fstate.copy_(rawstate.empty(device=self.fstate.device))
        if self.closed_f is not None:
            self.closed_f.copy_(self.fstate)
        self.istate.zero_()

    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in (self.fstate, self.istate, self.scratch, self.closed_f)
                   if t is not None)


def order(states):
    """Before torch ops read or write these TargetStates on the current stream: they wait for the op's launches on
    them from other streams (accumulate.order_states)."""
    accumulate.order_states([st.fstate for st in states])


def compiled_key(phase, key, device):
    """(phase, key, device) as plain strings and ints, for compiled code: Dynamo cannot rebuild a TargetKey made in
    compiled code outside the graph, and before torch 2.11 it cannot hash a dataclass, a device or a Kind (a str
    enum with str's __hash__) at all."""
    kind = key.kind.value if isinstance(key.kind, Kind) else key.kind  # a key may be made with a plain "output"
    return phase, key.module, kind, key.leaf, key.call, str(device)


def scratch_bytes(device):
    """Per-state scratch of the CUDA kernel (ticket + one partial per block of its grid), as the kernel
    computes it (csrc/cuda/accumulate_cuda.cu); the CPU kernel and the reference path need none."""
    device = torch.device(device)
    if device.type != "cuda" or not accumulate.has_cuda_kernel():
        return 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.ops.hookstats.cuda_scratch_bytes(index)


def mark_static(t):
    """Fixed addresses let CUDA graphs (torch.compile mode="reduce-overhead") keep the state in place."""
    try:
        torch._dynamo.mark_static_address(t)
    except Exception:  # older torch: nothing to mark
        pass


class StateStore:
    """Every target's state of one monitor: (phase, TargetKey, device) -> TargetState, and per device and phase a
    1-element uint8 flag, the device-side copy of the step's mode that the op reads (compiled code too): the
    values the step clock decides (StepClock.flag_modes), set through set_modes. Changing a flag's value
    recompiles and re-captures nothing."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.modes = (1,) * len(PHASES)  # what the flags hold, per phase (the step clock sets it)
        self._states = {}  # (phase, TargetKey, device) -> TargetState
        self._flags = {}  # (device, phase) -> flag
        self._compiled = {}  # compiled_key(phase, key, device) -> (state, flag): what compiled code looks up
        self._late = {}  # compiled_key()s first reached inside compiled code (a dict: torch 2.4 cannot set.add)
        self._late_rounds = 0  # how often allocate_late() allocated something
        self._split_steps = False  # states keep the open step apart (History sets it)
        self._op_params = cfg.op_params()
        self._lock = threading.RLock()  # exclusive(); re-entrant: a step end's listeners may run user code
        self._placements = {}  # TargetKey -> placement_of() the first DTensor measured for it (host-side)

    def __len__(self):
        return len(self._states)

    def flag(self, device, phase=Phase.TRAIN):
        flag = self._flags.get((device, phase))
        if flag is None:
            flag = self._flags[(device, phase)] = torch.tensor([self.modes[PHASES.index(phase)]], dtype=torch.uint8,
                                                               device=device)
            mark_static(flag)
        return flag

    def flags(self, device):
        """Allocates the flags of `device` (every phase): compiled code cannot."""
        for phase in PHASES:
            self.flag(device, phase)

    def set_modes(self, modes):
        """The flags' values per phase (PHASES order), as StepClock.flag_modes decides them."""
        if modes == self.modes:
            return
        self.modes = modes
        for (_, phase), flag in self._flags.items():
            flag.fill_(modes[PHASES.index(phase)])

    def state(self, key, device, phase):
        k = (phase, key, device)
        st = self._states.get(k)
        if st is None:
            st = self._states[k] = TargetState(key, phase, device, self.cfg)
            if self._split_steps:
                st.split_steps()
            self.flags(device)
            self._compiled[compiled_key(phase, key, device)] = (st, self._flags[(device, phase)])
        return st

    def note_placement(self, key, t):
        """Keeps how t, a tensor measured for key through its local part (a DTensor), lies over its mesh: once per
        target, eager code only. reduce(mesh=...) reads it (placement())."""
        if key not in self._placements:
            self._placements[key] = placement_of(t)

    def placement(self, key):
        """What note_placement() kept for key: ((mesh dimension name, "shard" | "replicate"), ...) or None."""
        return self._placements.get(key)

    def states(self, phase=None, reached_only=True):
        """[(TargetKey, device, TargetState)] of `phase` (default: every phase; a state has its .phase), in
        allocation order; reached_only leaves out preallocated states no hook has reached, as stats() does."""
        return [(key, device, st) for (ph, key, device), st in self._states.items()
                if (phase is None or ph == phase) and (st.reached or not reached_only)]

    def split_steps(self):
        """From now on states keep the open step (eval: the open validation pass) apart from the steps before it
        (History needs it)."""
        self._split_steps = True
        order(self._states.values())
        for st in self._states.values():
            st.split_steps()

    def resolve(self, key, device, phase, reach=True, compiling=None):
        """(state, flag) of key, or None inside compiled code when they do not exist yet: compiled code
        cannot allocate them, so they are allocated at the next eager point (one recompile, then measured).
        reach=False leaves marking the state as reached (listed by stats()) to the caller. compiling: what
        torch.compiler.is_compiling() says, from a caller that asked already (asked here when None)."""
        if torch.compiler.is_compiling() if compiling is None else compiling:
            plain = compiled_key(phase, key, device)
            target = self._compiled.get(plain)
            # the graph is guarded on _late_rounds: torch 2.8 guards no key missing from a dict, and would reuse a
            # graph that found no state after allocate_late() made it
            if target is None and self._late_rounds >= 0:
                self._late[plain] = None
                return None
            st, flag = target
        else:
            st = self._states.get((phase, key, device))
            if st is None:
                st = self.state(key, device, phase)
            flag = self._flags[(device, phase)]
        if reach:
            st.reached = True
        return st, flag

    def allocate_late(self):
        """Allocates what compiled code reached first (eager code only); returns [(phase, TargetKey, device)]."""
        if not self._late:
            return []
        late = sorted(((phase, TargetKey(module, Kind(kind), *rest), torch.device(dev))
                       for phase, module, kind, *rest, dev in self._late), key=lambda t: (t[0], t[1].id, str(t[2])))
        self._late = {}
        self._late_rounds += 1
        for phase, key, device in late:
            self.state(key, device, phase)
        return late

    def exclusive(self):
        """The op releases the GIL: two threads driving the model must not update one state at once, nor one
        update a state while another ends a step or resets (the history reads the open step, then empties it).
        Compiled code is one graph at a time, and cannot trace a lock."""
        return contextlib.nullcontext() if torch.compiler.is_compiling() else self._lock

    def accumulate(self, t, st, flag):
        with self.exclusive():
            accumulate.accumulate_(t, st.fstate, st.istate, st.scratch, flag, self._op_params)

    def bound(self, st, flag):
        """The op's arguments after x for state st: what an eager hook keeps once it has resolved its state."""
        return (st.fstate, st.istate, st.scratch, flag, self._op_params)

    def update(self, x, args):
        """The eager hooks' fast path: the op on x with bound() arguments, through accumulate_eager (no Python
        frame, no argument boxing). False when it did nothing: no eager entry (reference backend), or x is not a
        plain tensor on that state's device, or accumulate_ was swapped (the reference for a test or benchmark,
        plan()'s recorder); the caller then takes measured(), resolve() and accumulate()."""
        eager = accumulate.accumulate_eager_
        if eager is None or accumulate.accumulate_ is not accumulate.COMPILED_OP:
            return False
        with self._lock:
            return eager(x, *args)

    def accumulate_many(self, ts, sts, device, phase=Phase.TRAIN):
        with self.exclusive():
            accumulate.accumulate_many_(ts, [s.fstate for s in sts], [s.istate for s in sts], [s.scratch for s in sts],
                                        self.flag(device, phase), self._op_params)

    @staticmethod
    def to_host(states):
        """{id(state): (fstate, istate)} as NumPy rows: one packed device-to-host transfer per device."""
        order(states)
        by_dev = {}
        for st in states:
            by_dev.setdefault(st.fstate.device, []).append(st)
        host = {}
        for sts in by_dev.values():
            f = torch.cat([s.total_fstate() for s in sts]).cpu().numpy().reshape(len(sts), -1)
            i = torch.cat([s.istate for s in sts]).cpu().numpy().reshape(len(sts), -1)
            for k, s in enumerate(sts):
                host[id(s)] = (f[k], i[k])
        return host

    def reset(self):
        order(self._states.values())
        for st in self._states.values():
            st.reset()

    def memory(self, history=None):
        """Bytes held: running states and sampling flags on the devices, plus, from `history` (a History or
        None), its rings, host staging buffers and the steps mon.history() keeps on the host
        (host_history_bytes, growing up to `keep` steps)."""
        states = sum(st.nbytes() for st in self._states.values())
        states += sum(f.numel() * f.element_size() for f in self._flags.values())
        dev, host = history.nbytes() if history is not None else (0, 0)
        kept = history.memory_sink.nbytes() if history is not None else 0
        return {"state_bytes": states, "history_bytes": dev, "host_staging_bytes": host, "host_history_bytes": kept,
                "device_bytes": states + dev}
