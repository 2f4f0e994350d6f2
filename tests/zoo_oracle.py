"""An independent oracle for tests/test_zoo.py: hooks of its own on the same modules (forward hooks, tensor
hooks on the outputs, full backward hooks, the parameters' .grad before each optimizer step) keep a float64
copy of every value per (phase, target id, step); targets are named by README's rules, written from the
README and not from hookstats' code. The loop tells the oracle the step number and when backward runs."""
import collections
import inspect

import numpy as np
import torch

from helpers import oracle_parts as op_oracle_parts

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def is_float_tensor(obj):
    return isinstance(obj, torch.Tensor) and obj.dtype in FLOATS


def leaves(obj, path="", take=is_float_tensor):
    """README: each floating-point leaf of tuples, lists, dicts (HF ModelOutput) and dataclasses is a target;
    take(obj): whether obj is such a leaf (a Paddle tensor for the Paddle oracle)."""
    if take(obj):
        yield path, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from leaves(v, f"{path}[{k!r}]", take)
    elif isinstance(obj, (tuple, list)):
        for k, v in enumerate(obj):
            yield from leaves(v, f"{path}[{k}]", take)
    elif hasattr(obj, "__dataclass_fields__") and not isinstance(obj, type):
        for name in obj.__dataclass_fields__:
            yield from leaves(getattr(obj, name), f"{path}.{name}", take)


def slot_names(module):
    """README: the one required input is "name:input", optional ones as if passed by keyword
    ("name:input['hx']"); several required ones "[0]", "[1]"."""
    ps = [p for p in inspect.signature(module.forward).parameters.values()
          if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in ps if p.default is p.empty]
    if len(required) == 1 and ps[0] is required[0]:
        return lambda i: "" if i == 0 else f"[{ps[i].name!r}]" if i < len(ps) else f"[{i}]"
    return lambda i: f"[{i}]"


def positional(args, name_of):
    for i, a in enumerate(args):
        yield from leaves(a, name_of(i))


def values(t):
    """A tensor's values as float64 (a nested tensor: its components' values, no padding)."""
    t = t.detach()
    if t.is_nested:
        parts = [c.reshape(-1) for c in t.unbind()]
        t = torch.cat(parts) if parts else t.new_zeros(0)
    return t.reshape(-1).to(torch.float64).numpy().copy()


class Oracle:
    """Watches `modules` ({name: module}) of `root` the way attach() is asked to, recording every step
    whose number is a multiple of `every`. The loop sets .step, and .backward while loss.backward() runs
    (forwards then are checkpointing's recomputation: their values were recorded the first time)."""

    def __init__(self, root, modules, *, every=1, eval=False, inputs=False, grads=True, param_grads=False,
                 input_grads=()):
        self.root, self.every, self.track_eval = root, every, eval
        self.step, self.backward, self.phase = 0, False, "train"
        self.data = collections.defaultdict(list)  # (phase, target id, step) -> [(dtype, float64 values)]
        self.handles = [root.register_forward_pre_hook(self._on_root)]
        for name, m in modules.items():
            self.handles.append(m.register_forward_hook(self._output_hook(name, m, grads)))
            if inputs:
                self.handles.append(m.register_forward_pre_hook(self._input_hook(name, m), with_kwargs=True))
            if name in input_grads:
                self.handles.append(m.register_forward_pre_hook(self._requires_grad_hook(name)))
                self.handles.append(m.register_full_backward_hook(self._grad_input_hook(name, m)))
        # BackwardHook gives every positional tensor input a gradient once any requires grad (its Function makes
        # them all require grad); the README's grad_input is the gradient of the inputs that require grad
        self.wants_grad = {}  # module name -> positional input slots that required grad at its last call
        self.params = {}  # id -> (target id, param): the first name of a shared parameter
        if param_grads:
            for name, m in modules.items():
                for pn, p in m.named_parameters(recurse=False):
                    if p.requires_grad and id(p) not in self.params:
                        self.params[id(p)] = (f"{name}.{pn}:param_grad" if name else f"{pn}:param_grad", p)

    def remove(self):
        for h in self.handles:
            h.remove()

    # ---- what is recorded ----
    def sampled(self):
        # train values on steps k % every == 0; eval values (eval=True) in any step: a validation pass is never lost
        return self.step % self.every == 0 if self.phase == "train" else self.track_eval

    def record(self, tid, t, step=None, phase=None):
        self.data[(phase or self.phase, tid, self.step if step is None else step)].append((t.dtype, values(t)))

    def _on_root(self, module, args):
        if module is self.root and not self.backward:
            self.phase = "train" if module.training else "eval"

    def _output_hook(self, name, mod, grads):
        def hook(module, args, out):
            if module is not mod or not self.sampled():  # a deepcopy (EMA) of the model runs copied hooks
                return
            step, phase = self.step, self.phase
            for leaf, t in leaves(out):
                if not self.backward:
                    self.record(f"{name}:output{leaf}", t)
                if grads and t.requires_grad:
                    t.register_hook(lambda g, tid=f"{name}:grad_output{leaf}":
                                    None if g is None else self.record(tid, g, step, phase))
        return hook

    def _input_hook(self, name, mod):
        name_of = slot_names(mod)

        def hook(module, args, kwargs):
            if module is not mod or not self.sampled() or self.backward:
                return
            for leaf, t in (*positional(args, name_of), *leaves(kwargs)):
                self.record(f"{name}:input{leaf}", t)
        return hook

    def _requires_grad_hook(self, name):
        def hook(module, args):
            self.wants_grad[name] = {i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad}
        return hook

    def _grad_input_hook(self, name, mod):
        name_of = slot_names(mod)

        def hook(module, grad_input, grad_output):
            if module is mod and self.sampled():
                wants = self.wants_grad.get(name, ())
                kept = [g if i in wants else None for i, g in enumerate(grad_input)]
                for leaf, g in positional(kept, name_of):
                    self.record(f"{name}:grad_input{leaf}", g)
        return hook

    def before_optimizer_step(self):
        """Parameter gradients after accumulation, once per step (zero_grad(set_to_none=True) between)."""
        if self.step % self.every == 0:
            for tid, p in self.params.values():
                if p.grad is not None:
                    self.record(tid, p.grad, phase="train")

    # ---- expected statistics ----
    def targets(self, phase):
        return {tid for (ph, tid, _) in self.data if ph == phase}

    def kinds(self, phase="train"):
        """The target kinds the oracle saw: a test checks its oracle is not vacuous."""
        return {tid.split(":")[-1].split("[")[0] for tid in self.targets(phase)}

    def steps(self, phase="train"):
        return sorted({s for (ph, _, s), parts in self.data.items() if ph == phase and any(v.size for _, v in parts)})

    def expected(self, phase, tid, steps, cfg):
        """The statistics of target `tid` over `steps`, as hookstats' records name them."""
        parts = [p for s in steps for p in self.data.get((phase, tid, s), ())]
        return summarize(parts, cfg)

    def per_step(self, phase, cfg):
        """{(step, target id): expected record} of every step that measured something."""
        out = {}
        for (ph, tid, s), parts in self.data.items():
            if ph == phase and sum(v.size for _, v in parts):
                out[(s, tid)] = summarize(parts, cfg)
        return out


def assert_moments_agree(oracle, got, tids, cfg, *, atol=1e-7, phase="train"):
    """Each target's count exactly and its mean, std, min and max to rtol 1e-5 (+ atol) against the oracle's values
    over every step it recorded."""
    for tid in sorted(tids):
        exp = oracle.expected(phase, tid, oracle.steps(phase), cfg)
        assert got[tid]["count"] == exp["count"], tid
        for field in ("mean", "std", "min", "max"):
            np.testing.assert_allclose(got[tid][field], exp[field], rtol=1e-5, atol=atol, err_msg=f"{tid} {field}")


def summarize(parts, cfg):
    allv = np.concatenate([v for _, v in parts]) if parts else np.zeros(0)
    fin = allv[np.isfinite(allv)]
    rec = {"count": allv.size, "finite": fin.size, "nan": int(np.isnan(allv).sum()),
           "posinf": int(np.isposinf(allv).sum()), "neginf": int(np.isneginf(allv).sum()),
           "mean": fin.mean() if fin.size else np.nan, "std": fin.std(ddof=1) if fin.size > 1 else np.nan,
           "min": fin.min() if fin.size else np.nan, "max": fin.max() if fin.size else np.nan}
    # the op's own NumPy oracle (tests/helpers.py) bins in float32 as the kernels do, per input dtype
    got = None
    for dtype in {d for d, _ in parts}:
        v = np.concatenate([v for d, v in parts if d == dtype])
        o = op_oracle_parts(torch.from_numpy(v).to(dtype), cfg)
        got = o if got is None else {k: None if o[k] is None else got[k] + o[k] for k in ("near_zero", "lin", "log2")}
    nb = cfg.nbins
    if got is not None:
        lin = got["lin"]
        rec.update(near_zero_count=int(got["near_zero"]), underflow=int(lin[0]), overflow=int(lin[nb + 1]),
                   hist=lin[1: nb + 1], log2_hist=got["log2"])
    else:
        rec.update(near_zero_count=0, underflow=0, overflow=0, hist=None, log2_hist=None)
    return rec


def train_steps(params, xs, forward, oracle=None):
    """SGD steps of forward(x).square().mean() over xs, telling the oracle (if any) each step and when backward
    runs, its parameters' gradients taken before each optimizer step."""
    opt = torch.optim.SGD(params, lr=0.01)
    for k, x in enumerate(xs):
        if oracle is not None:
            oracle.step = k
        loss = forward(x).square().mean()
        if oracle is not None:
            oracle.backward = True
        loss.backward()
        if oracle is not None:
            oracle.backward = False
            oracle.before_optimizer_step()
        opt.step()
        opt.zero_grad()
