"""hookstats.plan(): what attach() would measure on a model and what it would cost, without running it.

The model is copied onto fake tensors (FakeTensorMode: shapes, dtypes and devices, no storage), the real
attach() hooks the copy with the same keywords, and one forward, backward and step run. The op is never
called: plan() stands in for it at the one seam every hook goes through (hookstats.accumulate.accumulate_ /
accumulate_many_, as bench.py's reference switch does) and records the tensor each call would read. So the
targets are those attach() creates, and the monitor's own memory is its real mon.memory()."""
import contextlib
import copy
import dataclasses
import inspect
import json
import math
import sys
import threading

import numpy as np
import torch
from torch import nn
from torch._subclasses.fake_tensor import (DataDependentOutputException, DynamicOutputShapeException, FakeTensor,
                                          FakeTensorMode, UnsupportedOperatorException)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map
from torch.utils.flop_counter import FlopCounterMode

from .. import accumulate, layout
from ..config import check_arg
from ..phases import Phase
from ..monitor import attach, attached_monitor
from ..records import bucket_columns
from ..sinks.memory import held_bytes
from ..tensors import tensor_leaves
from . import op_speed
from .summary import format_table


@dataclasses.dataclass
class TargetPlan:
    """One target attach() would create: the tensors its op calls read in one measured step."""
    id: str
    kind: str
    shapes: list  # one shape per op call in the step
    dtype: str
    device: str
    values: int  # values the op reads per measured step
    bytes: int  # bytes the op reads per measured step: also what a detach-to-CPU hook copies
    op_seconds: float = None  # predicted op time per measured step (None: no speed figure for the device)

    @property
    def calls(self):
        return len(self.shapes)

    @property
    def shape(self):
        return self.shapes[0] if len(set(self.shapes)) == 1 else None


class Plan:
    """The result of plan(): per target and in total, what is read, copied and held, and the predicted cost."""

    def __init__(self, targets, memory, flops, every, speed_source, notes=(), keep=None):
        self.targets, self.memory, self.flops, self.every, self.keep = targets, memory, flops, every, keep
        self.speed_source, self.notes = speed_source, list(notes)

    @property
    def values(self):
        return sum(t.values for t in self.targets)

    @property
    def bytes(self):
        """Bytes the op reads per measured step; a detach-to-CPU hook on the same targets copies as many to
        the host each step (and keeping the detached tensors on the device holds as many there)."""
        return sum(t.bytes for t in self.targets)

    @property
    def op_seconds(self):
        """Predicted op time per measured step, or None where there is no speed figure for a device."""
        per = [t.op_seconds for t in self.targets]
        return None if any(s is None for s in per) else sum(per)

    def detach_held(self, steps):
        """Bytes that detached copies of every target (on the host, or kept on the device) hold after `steps`."""
        return self.bytes * steps

    def predict(self, step_time=None, peak_flops=None, budget=0.05):
        """Step overhead from the op time and the step time (given in seconds, or the model's FLOPs per step
        at `peak_flops` FLOP/s), and the smallest every=N that keeps it under `budget` (0.05 = 5%)."""
        step_time, peak_flops, budget = (None if v is None else check_arg(name, v, float, lo=0, lo_open=True)
                                         for name, v in (("step_time", step_time), ("peak_flops", peak_flops),
                                                         ("budget", budget)))
        if step_time is None and peak_flops is not None:
            step_time = self.flops / peak_flops if self.flops else None
        out = {"step_seconds": step_time, "op_seconds": self.op_seconds, "budget": budget}
        if step_time and self.op_seconds is not None:
            out["overhead_every_1"] = self.op_seconds / step_time
            out["overhead"] = self.op_seconds / self.every / step_time
            out["every_for_budget"] = max(1, math.ceil(self.op_seconds / (budget * step_time) - 1e-9))
        return out

    def rows(self):
        return [{"target": t.id, "shape": "x".join(map(str, t.shape)) if t.shape is not None else "varies",
                 "dtype": t.dtype, "calls": t.calls, "values/step": t.values, "op reads": size_text(t.bytes),
                 "op us/step": None if t.op_seconds is None else round(t.op_seconds * 1e6, 1)} for t in self.targets]

    def to_dict(self, steps=100, **predict_kwargs):
        return {"targets": [{**dataclasses.asdict(t), "shapes": [list(s) for s in t.shapes], "calls": t.calls}
                            for t in self.targets],
                "total": {"targets": len(self.targets), "values": self.values, "bytes": self.bytes,
                          "op_seconds": self.op_seconds, "flops": self.flops, "every": self.every},
                "memory": dict(self.memory),
                "detach": {"bytes_per_step": self.bytes, "steps": steps, "held_after_steps": self.detach_held(steps)},
                "prediction": {**self.predict(**predict_kwargs), "speed_source": self.speed_source},
                "notes": self.notes}

    def table(self, steps=100, per_target=True, **predict_kwargs):
        d = self.to_dict(steps, **predict_kwargs)
        m, p = d["memory"], d["prediction"]
        lines = [format_table(self.rows(), ["target", "shape", "dtype", "calls", "values/step", "op reads",
                                            "op us/step"])] if per_target else []
        lines += ["",
                  f"total: {len(self.targets)} targets, {self.values:,} values and {size_text(self.bytes)} read by the op "
                  f"per measured step" + (f" (every={self.every})" if self.every > 1 else ""),
                  f"hookstats holds: {size_text(m['state_bytes'])} of state, {size_text(m['history_bytes'])} of history ring "
                  f"({size_text(m['device_bytes'])} on the device), {size_text(m['host_staging_bytes'])} of host staging "
                  "(mon.memory())",
                  *([f"mon.history() on the host after {self.keep} measured steps: {size_text(m['host_history_bytes'])} "
                     f"of fixed columns, at most {size_text(m['host_history_max_bytes'])} with the histograms' spans "
                     "(which slots the data uses)"] if m["host_history_max_bytes"] else []),
                  f"detach-to-CPU of the same targets: copies {size_text(self.bytes)} to the host per step, holds "
                  f"{size_text(self.detach_held(steps))} after {steps} steps; keeping them detached on the device "
                  f"holds as much there",
                  f"model FLOPs per step (forward + backward): {self.flops:.3g}"]
        if p["op_seconds"] is None:
            lines.append("op time: no speed figure for this device")
        else:
            lines.append(f"op time per measured step: {p['op_seconds'] * 1e3:.3f} ms ({p['speed_source']})")
        if "overhead" in p:
            at_every = f", {100 * p['overhead']:.2f}% at every={self.every}" if self.every > 1 else ""
            lines.append(f"step time {p['step_seconds'] * 1e3:.3f} ms: overhead {100 * p['overhead_every_1']:.2f}% "
                         f"measuring every step{at_every}; every={p['every_for_budget']} keeps it under "
                         f"{100 * p['budget']:g}%")
        return "\n".join(lines + [f"note: {n}" for n in self.notes])

    def __repr__(self):
        return f"Plan({len(self.targets)} targets, {size_text(self.bytes)} read per measured step)"


def size_text(n):
    for unit, scale in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


def _fake_like(t, device):
    """A fake tensor with t's shape, strides and dtype on `device` (default: t's own device; meta -> cpu)."""
    if device is None:
        device = t.device if t.device.type != "meta" else torch.device("cpu")
    f = torch.empty_strided(tuple(t.shape), t.stride(), dtype=t.dtype, device=device)
    if isinstance(t, nn.Parameter):
        return nn.Parameter(f, requires_grad=t.requires_grad)
    return f.requires_grad_(t.requires_grad) if t.is_floating_point() else f


def fake_copy(model, fake_mode, device=None):
    """A copy of `model` whose parameters and buffers are fake tensors (tied weights stay tied); the
    model itself is left as it is and none of its weights is copied."""
    memo = {}
    with fake_mode:
        for t in (*model.parameters(), *model.buffers()):
            memo.setdefault(id(t), _fake_like(t, device))
    return copy.deepcopy(model, memo)


class _Recorder:
    """Stands in for the op on the plan's fake tensors: records (state, shape, dtype, device) of each call.
    Any other call (a real monitor elsewhere in the process) goes to the real op."""

    def __init__(self, fake_mode):
        self.fake_mode, self.calls = fake_mode, {}  # id(fstate) -> [(shape, dtype, device, numel)]

    def _record(self, x, fstate):
        self.calls.setdefault(id(fstate), []).append((tuple(x.shape), x.dtype, x.device, x.numel()))

    def _ours(self, x):
        return isinstance(x, FakeTensor) and x.fake_mode is self.fake_mode

    _lock = threading.Lock()  # one plan at a time swaps the op: two overlapping swaps would lose one

    @contextlib.contextmanager
    def installed(self):
        with self._lock:
            real_one, real_many = accumulate.accumulate_, accumulate.accumulate_many_

            def one(x, fstate, *args):
                if not self._ours(x):
                    return real_one(x, fstate, *args)
                self._record(x, fstate)

            def many(xs, fstates, *args):
                if not all(self._ours(x) for x in xs):
                    return real_many(xs, fstates, *args)
                for x, f in zip(xs, fstates):
                    self._record(x, f)

            accumulate.accumulate_, accumulate.accumulate_many_ = one, many
            try:
                yield self
            finally:
                accumulate.accumulate_, accumulate.accumulate_many_ = real_one, real_many


class OpRefused(ValueError, RuntimeError):
    """An op raised on plan()'s fake tensors: a ValueError as plan()'s other refusals are, and still the
    RuntimeError the op raised for code that catches that."""


class _FailedOp(TorchDispatchMode):
    """Remembers the op whose fake kernel raised, so plan() can name it: a fake (meta) kernel may refuse what the
    real op runs (transformers' MoE experts call aten._grouped_mm, whose meta kernel takes only bfloat16)."""

    failed = None  # (op, the error it raised)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        try:
            return func(*args, **(kwargs or {}))
        except Exception as e:
            if self.failed is None or self.failed[1] is not e:
                self.failed = (func, e)
            raise


def default_loss(out):
    """The loss plan() backpropagates: a Hugging Face output's .loss when it has one (pass labels), else the
    sum of every floating output that requires grad."""
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    leaves = [t for _, t in tensor_leaves(out) if t.is_floating_point() and t.requires_grad]
    return sum(t.float().sum() for t in leaves) if leaves else None


def _listed(monitor, recorded):
    """(TargetKey, [records]) of every train target stats() would list after this step (the states a hook
    reached), in first-call order."""
    by_key = {}
    for key, _, st in monitor.states(Phase.TRAIN):
        by_key.setdefault(key, []).append(id(st.fstate))
    order = {fid: i for i, fid in enumerate(recorded)}
    first = {key: min(order.get(f, math.inf) for f in fids) for key, fids in by_key.items()}
    return [(key, [r for f in by_key[key] for r in recorded.get(f, [])])
            for key in sorted(by_key, key=lambda k: (first[k], k.id))]


def host_history(cfg, targets, keep):
    """(fixed, widest): the bytes mon.history() holds on the host once it keeps `keep` measured steps of
    `targets` targets (MemorySink's columns, sinks.memory.held_bytes): the fixed part is exact, the
    histograms' spans (the slots the records use, data-dependent) are counted at their widest."""
    buckets = np.zeros((1, layout.FLOAT_SLOTS), dtype=np.int64) if cfg.float_hist else None
    cols = bucket_columns(np.zeros((1, layout.FSTATE_SIZE)), np.zeros((1, cfg.istate_size), dtype=np.int64), buckets, cfg)
    return held_bytes(cols, targets, keep)


def plan(model, *example_inputs, example_kwargs=None, loss_fn=None, device=None, speed=None, **attach_kwargs):
    """What `hookstats.attach(model, **attach_kwargs)` would measure in one training step on these inputs,
    and what it would cost, found on fake tensors: nothing of the model's size is allocated, so a 70B model
    on the meta device plans in seconds on a laptop.

    example_inputs / example_kwargs: the model's inputs (real, meta or fake tensors: only shapes and dtypes
    count; a model whose forward branches on tensor values cannot be planned). loss_fn(output) -> scalar
    (default: default_loss). device: plan as if the model were there (default: where its parameters are;
    meta -> cpu; CUDA only where torch can use it, as autograd needs the device). speed: how op time is
    predicted: None for the default of the model's device (the H200 figures for CUDA, measured now for CPU), a
    device ("cuda": the H200 figures for a plan made on CPU tensors), an object with seconds(dtype, numel), or
    False for no time figures. sinks= are planned as history=True (the same device ring); nothing is written."""
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be an nn.Module, got {type(model).__name__}")
    if device is not None and torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise ValueError("plan(device='cuda') needs a torch that can use CUDA (autograd sets up the device); "
                         "plan on CPU tensors with speed='cuda' to get the H200 time figures")
    if attached_monitor(model) is not None:
        raise ValueError("plan() copies the model with its hooks, and the monitor attached to it would measure the "
                         "copy's fake tensors: plan before attach() or after mon.remove()")
    if attach_kwargs.pop("sinks", None) and not attach_kwargs.get("history"):
        attach_kwargs["history"] = True
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    fmodel = fake_copy(model, fake_mode, device)
    with fake_mode:
        to_fake = lambda t: _fake_like(t, device) if isinstance(t, torch.Tensor) else t  # noqa: E731
        args, kwargs = tree_map(to_fake, example_inputs), tree_map(to_fake, dict(example_kwargs or {}))
        fmodel.train()
        mon = attach(fmodel, **attach_kwargs)
        recorder, failed = _Recorder(fake_mode), _FailedOp()
        try:
            with recorder.installed(), FlopCounterMode(display=False) as flops, failed:
                out = fmodel(*args, **kwargs)
                loss = (loss_fn or default_loss)(out)
                if isinstance(loss, torch.Tensor) and loss.requires_grad:
                    loss.backward()
                mon.step()
        except (DataDependentOutputException, DynamicOutputShapeException) as e:
            raise ValueError(f"plan(): the model's forward reads tensor values ({e}), which fake tensors do not "
                             "have; pass inputs that avoid that branch (e.g. no attention mask)") from None
        except UnsupportedOperatorException as e:
            raise ValueError(f"plan(): the model's forward calls {e}, an op PyTorch cannot run on fake "
                             "tensors") from None
        except RuntimeError as e:
            if failed.failed is None or failed.failed[1] is not e:
                raise
            said = str(e).splitlines()[0]
            raise OpRefused(f"plan(): {failed.failed[0]} refused the model's fake tensors ({said}). If the model "
                            "runs with these inputs, the op's fake (meta) kernel takes less than the real one: plan "
                            "with the dtype and device the model trains with (model.to(torch.bfloat16), --dtype bf16 "
                            "on the command line)") from e
        listed = _listed(mon, recorder.calls)
        memory = mon.memory()
    keep = attach_kwargs.get("keep", inspect.signature(attach).parameters["keep"].default)
    memory["host_history_bytes"], memory["host_history_max_bytes"] = \
        host_history(mon.cfg, len(listed), int(keep)) if attach_kwargs.get("history") else (0, 0)
    if speed is None:
        devices = {r[2] for _, recs in listed for r in recs}
        speed = next(iter(devices)) if len(devices) == 1 else False
    notes = []
    if isinstance(speed, (str, torch.device)):
        if torch.device(speed).type == "cuda" and not any(r[2].type == "cuda" for _, recs in listed for r in recs):
            notes.append("planned on CPU tensors: on a GPU each state also holds the CUDA kernel's scratch and the "
                         "history's host staging is two pinned buffers, so mon.memory() there is larger")
        speed = op_speed.speed_for(speed, mon.cfg) or False
    targets = []
    for key, recs in listed:
        dtypes = sorted({str(r[1]).replace("torch.", "") for r in recs})
        targets.append(TargetPlan(
            id=key.id, kind=key.kind, shapes=[r[0] for r in recs], dtype="/".join(dtypes) or "-",
            device=",".join(sorted({str(r[2]) for r in recs})), values=sum(r[3] for r in recs),
            bytes=sum(r[3] * r[1].itemsize for r in recs),
            op_seconds=sum(speed.seconds(r[1], r[3]) for r in recs) if speed else None))
    return Plan(targets, memory, flops.get_total_flops(), mon.every, getattr(speed, "source", None), notes, int(keep))


# ---------------------------------------------------------------- python -m hookstats plan
def add_arguments(p):
    from . import presets
    from .args import int_in, positive_float
    p.add_argument("model", help=f"a preset ({', '.join(presets.PRESETS)}) or the path of a Hugging Face config.json")
    p.add_argument("--batch", type=int_in(1, 2 ** 31 - 1), default=1, help="batch size (default: 1)")
    p.add_argument("--seq", type=int_in(1, 2 ** 31 - 1), default=None, help="sequence length (default: the preset's)")
    p.add_argument("--dtype", choices=sorted(presets.DTYPES), default="bf16", help="parameter dtype (default: bf16)")
    p.add_argument("--device", default="cuda", help="plan for this device (default: cuda; no GPU needed)")
    p.add_argument("--step-time", type=positive_float(), metavar="SECONDS", help="your training step time")
    p.add_argument("--peak-tflops", type=positive_float(1e12), help="step time = the model's FLOPs at this peak (TFLOP/s)")
    p.add_argument("--budget", type=positive_float(), default=0.05, help="overhead budget for every=N (default: 0.05 = 5%%)")
    p.add_argument("--steps", type=int_in(1), default=100, help="steps for the held detach-to-CPU bytes (default: 100)")
    p.add_argument("--every", type=int_in(1), default=1, help="attach(every=N)")
    for flag, dest, what in (("--inputs", "inputs", "module inputs"), ("--input-grads", "input_grads", "input gradients"),
                             ("--param-grads", "param_grads", "parameter gradients"),
                             ("--separate-calls", "separate_calls", "each call apart"),
                             ("--history", "history", "the per-step history ring")):
        p.add_argument(flag, dest=dest, action="store_true", help=f"attach({dest}=True): {what}")
    p.add_argument("--no-outputs", dest="outputs", action="store_false", help="attach(outputs=False)")
    p.add_argument("--no-grads", dest="grads", action="store_false", help="attach(grads=False)")
    p.add_argument("--no-hist", action="store_true", help="attach(linear_hist=False, log_hist=False, float_hist=False)")
    p.add_argument("--modules", nargs="+", help="attach(modules=[...]): names or globs")
    p.add_argument("--totals", action="store_true", help="print the totals only, not one line per target")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def main(argv=None):
    """`python -m hookstats plan MODEL [options]`: prints the plan; bad arguments end with one line, status 2."""
    from . import presets
    from .args import Parser  # one-line errors with status 2, as the other commands
    p = Parser(prog="hookstats plan", description="What hookstats.attach() would measure on a "
                                "model and what it would cost, planned on fake tensors (nothing is downloaded "
                                "or allocated).")
    add_arguments(p)
    args = p.parse_args(argv)
    with presets.quiet_transformers():  # its notices (e.g. on the config's loss_type) are not ours to print
        return _plan_preset(args)


def _plan_preset(args):
    from . import presets
    try:
        model, inputs, kwargs = presets.build(args.model, batch=args.batch, seq=args.seq, dtype=args.dtype)
    except (ValueError, OSError) as e:
        print(f"hookstats plan: error: {e}", file=sys.stderr)
        return 2
    attach_kwargs = {k: getattr(args, k) for k in ("inputs", "input_grads", "param_grads", "separate_calls",
                                                  "history", "outputs", "grads", "every", "modules")}
    if args.no_hist:
        attach_kwargs.update(linear_hist=False, log_hist=False, float_hist=False)
    device = args.device if torch.device(args.device).type != "cuda" or torch.cuda.is_available() else "cpu"
    try:
        result = plan(model, *inputs, example_kwargs=kwargs, device=device, speed=args.device, **attach_kwargs)
    except ValueError as e:
        print(f"hookstats plan: error: {e}", file=sys.stderr)
        return 2
    predict = {"step_time": args.step_time, "budget": args.budget,
               "peak_flops": args.peak_tflops * 1e12 if args.peak_tflops is not None else None}
    if args.json:
        print(json.dumps(result.to_dict(args.steps, **predict), indent=1))
    else:
        print(result.table(args.steps, per_target=not args.totals, **predict))
    return 0
