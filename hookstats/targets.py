"""Where hooks attach: module outputs and the gradients flowing back into them, module inputs, gradients
w.r.t. module inputs, parameter gradients once per optimizer step, and any tensor (mon.watch). Each hook
only resolves a preallocated state and calls the fused op; none of them changes what it observes."""
import dataclasses
import functools
import inspect
import threading
import weakref

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._pytree import tree_flatten, tree_unflatten
from torch.nn.parameter import is_lazy
from torch.utils.hooks import BackwardHook
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

MEASURED_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def measured(t):
    """The plain strided tensor the op reads for t, or None when t is not measured: integer, bool, complex,
    quantized and float8 tensors, meta and sparse tensors, lazy parameters, and tensor subclasses whose
    data hookstats cannot read (a __torch_dispatch__ wrapper). A nested tensor is read through its packed
    values (TransformerEncoder's eval fast path), a DTensor through this rank's shard (mon.reduce() merges
    the ranks). Never an error: a monitor must not stop the forward."""
    kind = type(t)
    if (kind is torch.Tensor or kind is torch.nn.Parameter) and t.dtype in MEASURED_DTYPES \
            and t.layout == torch.strided and t.device.type != "meta" and not t.is_nested:
        return t  # the common case first: the hooks run this for every tensor
    if not isinstance(t, torch.Tensor) or t.dtype not in MEASURED_DTYPES:
        return None
    if torch.compiler.is_compiling():  # traced tensors are plain; the checks below would not trace
        return t if t.layout == torch.strided and t.device.type != "meta" else None
    if t.is_nested:
        return t.values() if t.layout == torch.jagged or t.is_contiguous() else t.contiguous().values()
    if t.layout != torch.strided or t.device.type == "meta" or kind is torch.Tensor or kind is torch.nn.Parameter:
        return None
    if is_lazy(t):
        return None
    if hasattr(t, "to_local"):  # DTensor
        return measured(t.to_local())
    if isinstance(t, FakeTensor):  # stands for a real tensor: the op's fake kernel takes it (hookstats.plan)
        return t
    return t if kind.__torch_dispatch__ is torch.Tensor.__torch_dispatch__ else None


def is_measurable(t):
    return measured(t) is not None


def unread_reason(t):
    """Why a floating tensor holding data is not measured (said once per target), or None when it is measured or
    is not meant to be (integer, bool, complex and meta tensors)."""
    if not isinstance(t, torch.Tensor) or t.dtype not in MEASURED_DTYPES or t.device.type == "meta" \
            or torch.compiler.is_compiling() or measured(t) is not None:
        return None
    if t.layout != torch.strided:
        return f"a {t.layout} tensor"
    return f"a {type(t).__name__}, a tensor subclass whose data hookstats cannot read"


def tensor_leaves(obj, path=""):
    """(path, tensor) for every tensor inside tuples, lists, dicts and dataclasses (HF ModelOutput too)."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, dict):  # ModelOutput is an OrderedDict
        for k, v in obj.items():
            yield from tensor_leaves(v, f"{path}[{k!r}]")
    elif isinstance(obj, (tuple, list)):
        for k, v in enumerate(obj):
            yield from tensor_leaves(v, f"{path}[{k}]")
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for fld in dataclasses.fields(obj):
            yield from tensor_leaves(getattr(obj, fld.name), f"{path}.{fld.name}")


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


_compile_methods = weakref.WeakKeyDictionary()  # owner -> function: called at the next Dynamo compile


def on_compile_start(method):
    """Calls method() (a bound method, held weakly) when Dynamo next starts compiling a frame: eager Python,
    before the compiled code runs. torch._dynamo.reset() clears Dynamo's callbacks, so this re-registers."""
    handler = getattr(torch._dynamo, "callback_handler", None)
    if handler is None:  # torch without compile callbacks
        return
    _compile_methods[method.__self__] = method.__func__
    if _compile_started not in handler.start_callbacks:
        handler.register_start_callback(_compile_started)


def _compile_started(args=None):
    trigger = getattr(args, "callback_trigger", None)
    if trigger is not None and trigger.name != "DYNAMO":  # a lazily compiled backward runs inside a step
        return
    waiting = list(_compile_methods.items())
    _compile_methods.clear()
    for owner, func in waiting:
        func(owner)


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
    ref = weakref.WeakMethod(method)

    def hook(*args):
        m = ref()
        return None if m is None else m(*args)

    handle = register(hook)
    _weak_hooks[:] = alive + [(ref, handle)]
    return handle


def global_optimizer_hook(method, post=False):
    return weakly(method, register_optimizer_step_post_hook if post else register_optimizer_step_pre_hook)


def in_recompute():
    """True while a forward runs inside backward: activation checkpointing recomputing its segment."""
    return torch._C._current_graph_task_id() != -1


def skip_now(mon):
    """Eager fast path: skip unsampled steps. Compiled code never branches on the step (that would
    recompile each step); there the device-side flag masks the op instead."""
    return not torch.compiler.is_compiling() and not mon.measuring


def recomputing():
    return not torch.compiler.is_compiling() and in_recompute()


# The gradient "tap" is Tensor.register_hook on the observed tensor, not an autograd.Function returning
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
    def tell(mon, key):
        mon.tell(f"view_grad:{key.id}", f"hookstats: {key.id} is not measured: the output is a view that an "
                 "in-place op (ReLU(inplace=True), Dropout(inplace=True), F.relu_, x.add_(...)) modified after "
                 "its module returned, and PyTorch then delivers only part of its gradient, or none. Use the "
                 "op out of place to measure it.")

    def settle(self, mon):
        for entry in self.pending:
            if self.modified(entry):
                self.tell(mon, entry[0])
        self.pending.clear()


def tap_grad(mon, key, t, phase):
    """Measures the gradient of the loss w.r.t. t (the value t had here, before any later in-place op)."""
    if not (t.requires_grad and is_measurable(t)):
        if t.requires_grad and (why := unread_reason(t)) is not None:
            mon.tell(f"unread:{key.id}", f"hookstats: {key.id} is not measured: its tensor is {why}")
        return
    compiling = torch.compiler.is_compiling()
    if not COMPILED_GRAD_TAPS and compiling:
        mon.untapped = True
        return
    # eager: listed once a gradient arrives; compiled: once tapped (a backward hook cannot mutate Python state)
    target = mon.resolve(key, t.device, phase, reach=compiling)
    if target is None:
        return
    st, flag = target
    view = mon.view_taps.add(key, t) if not compiling and t._is_view() else None
    step = None if compiling else mon.step_count  # read in eager code only: compiled code would guard on it

    def on_grad(g):
        if torch.compiler.is_compiling():  # g is dense with t's dtype; the strict backward bans .layout
            mon.accumulate(g, st, flag)
        elif view is not None and ViewTaps.modified(view):
            ViewTaps.tell(mon, key)
        elif mon.attached and (g := measured(g)) is not None:
            if step is not None and mon.step_count != step:
                tell_split_step(mon, key, step)
            st.reached = st.reached or mon.sampling  # paused since the forward: the flag masks the op
            mon.accumulate(g, st, flag)
        return None

    t.register_hook(on_grad)


def tell_split_step(mon, key, step):
    mon.tell("split_step", f"hookstats: the gradient of {key.id} from step {step} arrived in step {mon.step_count}: "
                           "several train forwards ran before one backward (two views of a batch, R-Drop, a "
                           "generator called twice), and each forward started a step, so the gradients are "
                           "measured in a later step than their forward (and not at all if every=N skips it). "
                           "Count steps with steps='manual' and mon.step() after each optimizer step.")


def skip_recomputed_call(mon, name, recompute):
    """separate_calls=True: a call recomputed by activation checkpointing cannot be matched to its index in
    the original forward, so it is skipped (True). Non-reentrant checkpointing loses nothing by that (its
    gradients reach the forward's taps); reentrant checkpointing ran the forward without grad, which is
    noted here, so the loss of its gradients is said once."""
    if not recompute:
        if not torch.is_grad_enabled():
            mon.gradless_calls.add(name)
        return False
    if name in mon.gradless_calls:
        mon.tell("recompute_calls", "hookstats: with separate_calls=True, gradients flowing through segments "
                                    "recomputed by activation checkpointing (use_reentrant=True) are not "
                                    "measured: a recomputed call cannot be matched to its index")
    return True


def output_hook(mon, name, values=True, grads=True):
    """Forward hook: each floating leaf of the output, and (grads) the gradient flowing back into it."""
    def hook(module, args, out):
        # a recomputed forward (checkpointing) was measured the first time; with use_reentrant=True
        # its gradients flow through the recomputed graph only, so they are tapped there
        recompute = recomputing()
        if not mon.measures_phase() or skip_now(mon) or recompute and not grads:
            return None
        if mon.separate_calls and skip_recomputed_call(mon, name, recompute):
            return None
        mon.saw(name)
        call = mon.call_of(name)
        phase = mon.phase
        for leaf, t in tensor_leaves(out):
            key = mon.key(name, "output", leaf, call)
            if values and not recompute:
                mon.measure_in(key, t, phase)
            if grads:
                tap_grad(mon, mon.key(name, "grad_output", leaf, call), t, phase)
        return None
    return hook


def positional_names(module):
    """How positional inputs are named, from module.forward's signature, so that one input slot is one
    target whatever a call passes: when exactly one positional parameter has no default, it is named like
    a tensor ("gru:input") and the optional ones by their parameter name, as if passed by keyword
    ("gru:input['hx']"); otherwise every slot is "[i]" (attention's query, key and value). None: by slot."""
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    return [p.name for p in positional] if len(required) == 1 and positional[0] is required[0] else None


def positional_leaves(args, names):
    """(path, tensor) of every tensor inside the positional inputs (or their gradients), named as
    positional_names() says."""
    if names is None:
        yield from tensor_leaves(tuple(args))
        return
    for i, a in enumerate(args):
        yield from tensor_leaves(a, "" if i == 0 else f"[{names[i]!r}]" if i < len(names) else f"[{i}]")


def input_hook(mon, name, module):
    """Forward pre-hook (with kwargs): each floating leaf of the positional inputs (positional_names
    names them) and of the keyword inputs ("['attention_mask']")."""
    names = positional_names(module)

    def hook(module, args, kwargs):
        if not mon.measures_phase() or skip_now(mon) or recomputing():
            return None
        mon.saw(name)
        call = mon.call_of(name)
        for leaf, t in (*positional_leaves(args, names), *tensor_leaves(kwargs)):
            mon.measure_in(mon.key(name, "input", leaf, call), t, mon.phase)
        return None
    return hook


class CallStacks:
    """What each running call of a module left open, a stack per thread: nested calls (a module calling itself)
    stack up, and a call ending in one thread never closes another thread's call. Compiled code is traced
    as one thread."""

    def __init__(self):
        self.stacks = {}  # thread id -> [item of each open call, innermost last]

    def push(self, item):
        self.stacks.setdefault(thread_id(), []).append(item)

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

    def __init__(self, mon, name):
        self.mon, self.name = mon, name
        self.count = 0
        self.running = CallStacks()

    def pre_hook(self, module, args):
        if not self.running and not torch.compiler.is_compiling() and self.mon.root_running == 0:
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


class InputGrads:
    """input_grads=True: gradients w.r.t. a module's positional inputs, through the module only.

    Each call gets its own torch.utils.hooks.BackwardHook, the object register_full_backward_hook sets up
    per call (the same identity nodes on inputs and outputs, the same gradients, the same ban on in-place
    ops on them), which lets each call keep its index ("fc:grad_input@1"), wraps the tensors nested in
    the output too (an LSTM's (out, (h, c))), and sets nothing up where no input requires grad (PyTorch
    would fire its hook with Nones, with a warning each time)."""

    def __init__(self, mon, name, module):
        self.mon, self.name = mon, name
        self.names = positional_names(module)
        self.open = CallStacks()  # BackwardHook (or None) of each call whose forward is running

    def reset(self):
        self.open.clear()

    def pre_hook(self, module, args):
        mon = self.mon
        skip = not mon.measures_phase() or skip_now(mon)
        if not skip and mon.separate_calls:
            skip = skip_recomputed_call(mon, self.name, recomputing())
        if skip or not (torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)):
            self.open.push(None)
            return None
        bw = BackwardHook(module, [self._measure(mon.call_of(self.name), mon.phase)], [])
        self.open.push(bw)
        return bw.setup_input_hook(args)

    def forward_hook(self, module, args, out):
        bw = self.open.pop()
        if bw is None:
            return None
        leaves, spec = tree_flatten(out)
        if not any(isinstance(t, torch.Tensor) and t.requires_grad for t in leaves):
            if any(t.requires_grad for _, t in tensor_leaves(out)):
                self.mon.tell(f"grad_input_out:{self.name}",
                              f"hookstats: {self.name}: gradients w.r.t. its inputs are not measured: its output, a "
                              f"{type(out).__name__}, is not a container torch.utils._pytree can rebuild")
            return None  # no gradient will flow back through this call
        return tree_unflatten(list(bw.setup_output_hook(tuple(leaves))), spec)

    def _measure(self, call, phase):
        mon, name = self.mon, self.name

        def hook(module, grad_input, grad_output):
            if not mon.attached:
                return None
            for leaf, g in positional_leaves(grad_input, self.names):
                mon.measure_in(mon.key(name, "grad_input", leaf, call), g, phase)
            return None
        return hook


def starts_in_place(m):
    """True if m modifies its input in place first: an in-place module (ReLU(inplace=True)...), or an
    nn.Sequential whose first module (recursively) is one."""
    while isinstance(m, torch.nn.Sequential) and len(m) > 0:
        m = m[0]
    return getattr(m, "inplace", False) is True


def followed_in_place(model, modules):
    """Names of selected modules whose input or output an in-place op modifies, as far as nn.Sequential
    shows it: the module itself starts in place, or the next module of an nn.Sequential (found through the
    nesting both ways) does. A full backward hook on them would make that in-place op raise; in-place ops
    in a forward function cannot be seen here."""
    parents = {}
    for pname, p in model.named_modules():
        if isinstance(p, torch.nn.Sequential):
            kids = list(p.named_children())
            for i, (k, _) in enumerate(kids):
                parents[f"{pname}.{k}" if pname else k] = (pname, kids[i + 1][1] if i + 1 < len(kids) else None)
    out = {name for name, m in modules.items() if starts_in_place(m)}
    for name in modules:
        n = name
        while n in parents:
            parent, nxt = parents[n]
            if nxt is not None:
                if starts_in_place(nxt):
                    out.add(name)
                break
            n = parent  # the last module's output is the parent Sequential's output
    return out


def watch(mon, name, t):
    """mon.watch(name, t): measures t now and, if it requires grad, its gradient. Returns t unchanged."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"watch: name must be a non-empty string, got {name!r}")
    if not is_measurable(t):
        raise ValueError(f"watch({name!r}, ...): expected a float32/float64/float16/bfloat16 tensor, got "
                         f"{t.dtype if isinstance(t, torch.Tensor) else type(t).__name__}")
    if not mon.attached or not mon.measures_phase() or skip_now(mon):
        return t
    recompute = recomputing()
    if mon.separate_calls and skip_recomputed_call(mon, name, recompute):
        return t
    mon.saw(name)
    call = mon.next_watch_call(name)
    phase = mon.phase
    if not recompute:
        mon.measure_in(mon.key(name, "watch", "", call), t, phase)
    tap_grad(mon, mon.key(name, "watch_grad", "", call), t, phase)
    return t


class ParamGrads:
    """Parameter gradients after accumulation, one state per parameter, measured once per optimizer step.

    A post-accumulate-grad hook only marks the parameter as fresh (no device work per micro-batch); the
    fresh gradients are measured with one multi-tensor op per device just before any torch.optim
    optimizer steps (a global step pre-hook, so no optimizer has to be passed), or at mon.step() for
    loops without a torch.optim optimizer. Frozen parameters (requires_grad=False) get no hook and no state.
    """

    def __init__(self, mon, named_params):
        self.mon = mon
        self.params = {}  # id(param) -> (key, param)
        meta = [name for name, p in named_params if p.device.type == "meta"]
        if meta:
            raise ValueError(f"param_grads=True: parameters {meta[:4]} are on the meta device; materializing them "
                             "(to_empty) makes new parameter objects, which would never be measured: attach after it")
        for name, p in named_params:
            if p.requires_grad and p.is_floating_point() and id(p) not in self.params:
                self.params[id(p)] = (mon.key(name, "param_grad", "", None), p)
        self.fresh = {}
        self.unsampled = 0  # optimizer steps with fresh gradients in unsampled steps, while none was measured
        self.handles = [weakly(self._mark, p.register_post_accumulate_grad_hook) for _, p in self.params.values()]
        self.handles.append(global_optimizer_hook(self._on_optimizer_step))
        for key, p in self.params.values():
            mon.resolve(key, p.device, "train", reach=False)

    def _mark(self, p):
        self.fresh[id(p)] = p

    def _on_optimizer_step(self, optimizer, args, kwargs):
        self.mon.eager_point()
        ids = [id(p) for group in optimizer.param_groups for p in group["params"]]
        self.flush(ids)

    def flush(self, ids=None):
        """Measures the fresh gradients (of `ids`, default all) and forgets them."""
        ids = list(self.fresh) if ids is None else [i for i in ids if i in self.fresh]
        if not ids:
            return
        self.flushed = True
        by_dev = {}
        if not self.mon.sampling and self.unsampled >= 0:
            self.unsampled += 1
            if self.unsampled > self.mon.every:
                self.unsampled = -1  # said once
                self.mon.tell("param_grads_unsampled", (
                   f"hookstats: param_grads=True has measured nothing in {self.mon.every + 1} optimizer steps: each "
                   f"fell on a step that every={self.mon.every} does not sample (a step is a train forward, and "
                   "gradient accumulation runs several per optimizer step). Count steps with steps='manual' and "
                   "mon.step() after each optimizer step, or pick an every that the forwards per step do not divide."))
        elif self.mon.sampling:
            self.unsampled = -1
        for i in ids:
            p = self.fresh.pop(i)
            g = measured(p.grad)  # a DTensor (FSDP2): this rank's shard
            if g is None or not self.mon.sampling:
                continue
            target = self.mon.resolve(self.params[i][0], g.device, "train")
            if target is not None:
                by_dev.setdefault(g.device, []).append((g, target[0]))
        for dev, items in by_dev.items():
            self.mon.accumulate_many([g for g, _ in items], [st for _, st in items], dev)

    flushed = False  # some optimizer step or mon.step() came to measure fresh gradients

    def tell_if_never_measured(self):
        """Gradients computed that nothing came to measure: a loop without a torch.optim optimizer and
        without mon.step() (a hand-written update) would otherwise measure no parameter gradient in silence."""
        if self.fresh and not self.flushed and self.mon.step_count >= 2:  # a first step may not have stepped yet
            self.mon.tell("param_grads_never", (
                "hookstats: param_grads=True has measured no parameter gradient: they are measured when a "
                "torch.optim optimizer steps or at mon.step(), and neither happened; call mon.step() after each "
                "update of a loop without a torch.optim optimizer."))

    def clear(self):
        self.fresh.clear()

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles.clear()
        self.fresh.clear()
