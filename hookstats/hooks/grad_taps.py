"""Gradient taps: a hook on an observed tensor's autograd node (a module's output, a watched tensor) measures the
gradient of the loss w.r.t. it; taps on views are checked for in-place ops (ViewTaps)."""
import torch

from ..tensors import MEASURED_DTYPES, is_measurable, measured, unread_reason

PLAIN = (torch.Tensor, torch.nn.Parameter)  # the tensor types a tap's cached target serves


# The gradient "tap" is a hook on the observed tensor's autograd node (eager: GradTap, a pre-hook on its grad_fn;
# compiled: Tensor.register_hook, which Dynamo traces), not an autograd.Function returning
# x.view_as(x): PyTorch forbids in-place ops on a custom Function's view output (ReLU(inplace=True) after a
# hooked layer raises, eager and compiled), and a tap would replace the module's output object. Dynamo
# traces tensor hooks on intermediates into the compiled backward with no graph break (tests/test_compile.py).
# torch 2.11's Dynamo puts the state tensors such a hook reads after the node that uses them and inductor
# rejects the graph ("... of Node 'autograd_function_apply' was used before it has been defined", seen on
# 2.11.0, CPU and CUDA); 2.13 compiles it. Older torch: gradient taps are left out of compiled code, said once.
COMPILED_GRAD_TAPS = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 13)


class ViewTaps:
    """Gradient taps on outputs that are views (a Linear on a 3-d input returns a view of its 2-d result;
    MultiheadAttention, Flatten, x[:, :k] too). A tensor hook gets the gradient of the value the tensor had
    when the hook was registered, even after an in-place op, except on a view: an in-place op on a view, or
    on its base, reroutes the base's gradient around the view's node (CopySlices), so the hook gets part of
    the gradient or none. Such a tap is dropped and its target named in a warning, never measured partly.

    Each tap keeps an alias sharing the view's version counter but not its storage (no activation is kept
    alive), and the version when tapped. A changed version means an in-place op touched the view's memory
    after the module returned: checked when the gradient arrives, and at the next eager point for the taps
    whose gradient never arrived."""

    def __init__(self):
        self.pending = []  # (key, alias, version) tapped since the last eager point

    def add(self, key, t):
        alias = t.detach()
        with torch.autograd._unsafe_preserve_version_counter(alias):
            alias.set_()  # drops the storage reference, keeps the shared version counter
        entry = (key, alias, t._version)
        self.pending.append(entry)
        return entry

    @staticmethod
    def modified(entry):
        return entry[1]._version != entry[2]

    @staticmethod
    def say_modified(tell, key):
        tell(f"view_grad:{key.id}", f"hookstats: {key.id} is not measured: the output is a view that an "
                 "in-place op (ReLU(inplace=True), Dropout(inplace=True), F.relu_, x.add_(...)) modified after "
                 "its module returned, and PyTorch then delivers only part of its gradient, or none. Use the "
                 "op out of place to measure it.")

    def settle(self, tell):
        for entry in self.pending:
            if self.modified(entry):
                self.say_modified(tell, entry[0])
        self.pending.clear()


def tap_grad(port, key, t, phase, table=None):
    """Measures the gradient of the loss w.r.t. t (the value t had here, before any later in-place op). table: the
    module's StateStore.table()."""
    if not (t.requires_grad and is_measurable(t)):
        if t.requires_grad and (why := unread_reason(t)) is not None:
            port.tell(f"unread:{key.id}", f"hookstats: {key.id} is not measured: its tensor is {why}")
        return
    compiling = torch.compiler.is_compiling()
    if not COMPILED_GRAD_TAPS and compiling:
        port.untapped = True
        return
    # eager: listed once a gradient arrives; compiled: once tapped (a backward hook cannot mutate Python state)
    store, clock = port.store, port.clock
    target = store.resolve(key, t.device, phase, reach=compiling, compiling=compiling, table=table)
    if target is None:
        return
    st, flag = target
    view = port.view_taps.add(key, t) if not compiling and t._is_view() else None
    step = None if compiling else clock.step_count  # read in eager code only: compiled code would guard on it
    # the hook keeps no key made in compiled code: Dynamo rebuilds the closure of a hook on a graph's output after the
    # graph, which would specialize the graph on the module's name (a graph per block compiled on its own)
    key = None if compiling else key

    def on_grad(g):
        if torch.compiler.is_compiling():  # g is dense with t's dtype; the strict backward bans .layout
            store.accumulate(g, st, flag)
            st.reached = True  # tapped in an eager forward, met in compiled autograd: listed from here
            return g  # not None: compiled autograd hands a None from a hook traced in a compiled forward on as the gradient
        elif view is not None and ViewTaps.modified(view):
            ViewTaps.say_modified(port.tell, key)
        elif clock.attached and (x := measured(g)) is not None:
            if step is not None and clock.step_count != step:
                tell_split_step(port.tell, key, step, clock.step_count)
            st.reached = st.reached or clock.measures(phase)  # paused since the forward: the flag masks the op
            store.accumulate(x, st, flag)
            if x is not g and key is not None:
                store.note_placement(key, g)
        return None

    t.register_hook(on_grad)


class GradTap:
    """tap_grad's eager path for one target and phase, with what every call shares resolved once: the state and
    the op's bound arguments, kept for the device they were resolved on (StateStore.update checks the gradient's
    device and kind itself; anything else takes tap_grad's checks). The gradient is met by a pre-hook on the
    output's grad_fn node, which gets the gradient of the value the output had when tapped (an in-place op
    later gives the tensor a new node), as Tensor.register_hook does, for less host time per call; a leaf
    output has no node and gets Tensor.register_hook."""

    def __init__(self, port, key, phase):
        self.port, self.key, self.phase = port, key, phase
        self.target = None  # (state, flag, bound op arguments) on the device resolved last

    def __call__(self, t):
        if not t.requires_grad:
            return
        if type(t) not in PLAIN or t.dtype not in MEASURED_DTYPES or self.target is None:
            self.target = self.resolve(t)
            if self.target is None:
                return
        port, clock, key, phase = self.port, self.port.clock, self.key, self.phase
        st, flag, bound = self.target
        view = port.view_taps.add(key, t) if t._is_view() else None
        step = clock.step_count
        store = port.store

        def on_grad(g):
            if torch.compiler.is_compiling():  # compiled autograd traces the hooks of an eager forward
                store.accumulate(g, st, flag)
                st.reached = True
            elif view is not None and ViewTaps.modified(view):
                ViewTaps.say_modified(port.tell, key)
            elif clock.attached:
                if clock.step_count != step:
                    tell_split_step(port.tell, key, step, clock.step_count)
                if store.update(g, bound):
                    st.reached = st.reached or clock.measures(phase)  # paused since the forward: the flag masks the op
                elif (x := measured(g)) is not None:  # another device or kind, or accumulate_ swapped
                    target = store.resolve(key, x.device, phase, reach=False)
                    target[0].reached = target[0].reached or clock.measures(phase)
                    store.accumulate(x, *target)
                    if x is not g:
                        store.note_placement(key, g)

        node = t.grad_fn
        if node is None:
            t.register_hook(on_grad)
        else:
            nr = t.output_nr
            node.register_prehook(lambda grads: None if grads[nr] is None else on_grad(grads[nr]))

    def resolve(self, t):
        """(state, flag, bound arguments) for t's device, or None when t's gradient is not measured (said once
        where hookstats cannot read it)."""
        port, key = self.port, self.key
        if not is_measurable(t):
            if (why := unread_reason(t)) is not None:
                port.tell(f"unread:{key.id}", f"hookstats: {key.id} is not measured: its tensor is {why}")
            return None
        st, flag = port.store.resolve(key, t.device, self.phase, reach=False)
        return st, flag, port.store.bound(st, flag)


def tell_split_step(tell, key, step, now):
    tell("split_step", f"hookstats: the gradient of {key.id} from step {step} arrived in step {now}: "
                       "several train forwards ran before one backward (two views of a batch, R-Drop, a "
                       "generator called twice), and each forward started a step, so the gradients are "
                       "measured in a later step than their forward (and not at all if every=N skips it). "
                       "Count steps with steps='manual' and mon.step() after each optimizer step.")
