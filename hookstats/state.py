"""The one owner of the device state: every target's state (allocated once, updated in place by the fused op), the
device-side sampling flags, the lookup compiled code uses and states first reached inside it, and the lock that keeps
threads' updates apart. What a target is: targets.py; its buffers: buffers.py; host reads: host.py; the bytes held:
footprint.py."""
import contextlib
import threading

import torch

from . import accumulate
from .buffers import TargetState, mark_static, order, scratch_bytes  # noqa: F401 (hookstats.state's names)
from .footprint import memory
from .host import to_host
from .phases import PHASES, Phase  # noqa: F401 (what a state is measured in, beside Kind)
from .targets import FORWARD_KINDS, KINDS, OPTIMIZER_KINDS, Kind, TargetKey, key_parts  # noqa: F401 (hookstats.state's names)
from .tensors import placement_of


def compiled_key(phase, key, device):
    """(phase, key, device) as plain strings and ints, for compiled code: Dynamo cannot rebuild a TargetKey made in
    compiled code outside the graph, and before torch 2.11 it cannot hash a dataclass, a device or a Kind (a str
    enum with str's __hash__) at all."""
    module, kind, leaf, call = key_parts(key)  # a TargetKey, or the tuple a compiled hook makes
    kind = kind.value if isinstance(kind, Kind) else kind  # a key may be made with a plain "output"
    return phase, module, kind, leaf, call, str(device)


def outside_inference():
    """Where the state is allocated: a state first reached under torch.inference_mode() (a validation pass before
    training: Lightning's sanity check) made there would be an inference tensor, which the train steps after it
    could not update."""
    return torch.inference_mode(False)


def table_key(phase, key, device):
    """compiled_key() without the module's name: the key into that module's own table (StateStore.table). key: a
    TargetKey or targets.key_parts' tuple."""
    _, kind, leaf, call = key_parts(key)
    return phase, kind.value if isinstance(kind, Kind) else kind, leaf, call, str(device)


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
        self._tables = {}  # module name -> {table_key(phase, key, device): (state, flag)} (table())
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
            with outside_inference():
                flag = torch.tensor([self.modes[PHASES.index(phase)]], dtype=torch.uint8, device=device)
            self._flags[(device, phase)] = flag
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
            with outside_inference():
                st = self._states[k] = TargetState(key, phase, device, self.cfg)
                if self._split_steps:
                    st.split_steps()
            self.flags(device)
            self._compiled[compiled_key(phase, key, device)] = (st, self._flags[(device, phase)])
            self.table(key.module)[table_key(phase, key, device)] = self._compiled[compiled_key(phase, key, device)]
        return st

    def table(self, module):
        """The states of module `module` (a name) by table_key(), for its hooks to hold: compiled code that looks a
        state up by the module's name is specialized on that name, so a block compiled on its own (regional
        compile: `for b in model.layers: b.compile()`) would compile one graph per block, and past Dynamo's
        recompile limit run the rest eagerly. Looked up in a table the hook holds, the name is never read, and
        every block shares one graph."""
        table = self._tables.get(module)
        if table is None:
            table = self._tables[module] = {}
        return table

    def note_placement(self, key, t):
        """Keeps how t, a tensor measured for key through its local part (a DTensor), lies over its mesh: once per
        target, eager code only. reduce(mesh=...) reads it (placement())."""
        if key not in self._placements:
            self._placements[key] = placement_of(t)

    def placement(self, key):
        """What note_placement() kept for key: ((mesh dimension name, "shard" | "replicate"), ...) or None."""
        return self._placements.get(key)

    def read_through_local_part(self, key):
        """Whether a DTensor was measured for key (through this rank's part), over a mesh with named dimensions
        or not: reduce() never takes such a target for a whole copy (hookstats.param_copies)."""
        return key in self._placements

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

    def resolve(self, key, device, phase, reach=True, compiling=None, table=None):
        """(state, flag) of key, or None inside compiled code when they do not exist yet: compiled code
        cannot allocate them, so they are allocated at the next eager point (one recompile, then measured).
        reach=False leaves marking the state as reached (listed by stats()) to the caller. compiling: what
        torch.compiler.is_compiling() says, from a caller that asked already (asked here when None). table: the
        module's table() (compiled code then does not read the module's name while the state exists)."""
        if torch.compiler.is_compiling() if compiling is None else compiling:
            target = self._compiled.get(compiled_key(phase, key, device)) if table is None else \
                table.get(table_key(phase, key, device))
            # the graph is guarded on _late_rounds: torch 2.8 guards no key missing from a dict, and would reuse a
            # graph that found no state after allocate_late() made it
            if target is None and self._late_rounds >= 0:
                self._late[compiled_key(phase, key, device)] = None
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

    to_host = staticmethod(to_host)  # {id(state): (fstate, istate)} as NumPy rows (host.py)

    def reset(self):
        order(self._states.values())
        for st in self._states.values():
            st.reset()

    def nbytes(self):
        """Bytes of the running states and the sampling flags on the devices."""
        return sum(st.nbytes() for st in self._states.values()) + sum(f.numel() * f.element_size()
                                                                     for f in self._flags.values())

    def memory(self, history=None):
        """footprint.memory() of these states with `history` (a History or None)."""
        return memory(self.nbytes(), history)
