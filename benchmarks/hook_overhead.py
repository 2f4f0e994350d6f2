"""The hook path's host cost, beside PyTorch's own hooks and the floor (reading each measured value once).

part "calls": per-call host time of an output hook and of a gradient tap on small tensors (a chain of `--chain`
modules y = x * w on 4 KB tensors, forward and backward), beside a plain forward hook doing nothing and a plain
forward hook whose o.register_hook(...) does nothing; hookstats with the op replaced by a no-op splits the
Python path from the op; and the op alone per call (torch.ops, the eager entry, x.sum()).
part "steps": the training step of the CNN, the GPT-style decoder (d 256, 4 blocks, seq 128) and GPT-2 small from
a transformers config (GPT2Config(), nothing downloaded; --gpt2-layers to shorten it) for: no hooks; the floor
(the user's own forward hooks doing o.sum() on each output and g.sum() on the gradient flowing into it, via
o.register_hook); the floor on outputs only; hookstats defaults; histograms off; outputs only with histograms off.

One torch thread, the thread's CPU clock, one model copy per variant, interleaved rounds with the order rotated
each round; each figure is the median over rounds of a per-round ratio (or difference), with its IQR. Results as
JSON under benchmarks/results/.

    PYTHONPATH=. python benchmarks/hook_overhead.py --part calls --rounds 31
    PYTHONPATH=. python benchmarks/hook_overhead.py --part steps --workloads cnn transformer gpt2 --rounds 16
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import results_file
import torch
from torch import nn
from torch.nn import functional as F

from hookstats.tools.bench import NO_HISTOGRAMS

STABLE_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(2 ** 32), "MALLOC_TRIM_THRESHOLD_": str(2 ** 34),
                 "MALLOC_TOP_PAD_": str(2 ** 28)}  # as benchmarks/step_floor.py: no page faults that come and go


def quartiles(xs):
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return {"median": round(q[1], 4), "iqr": [round(q[0], 4), round(q[2], 4)], "n": len(xs)}


def interleave(steps, rounds, per_round, warmup=2):
    """{label: [median CPU time of `per_round` steps, one per round]} with the order rotated each round."""
    labels = list(steps)
    for step in steps.values():
        for _ in range(warmup):
            step()
    out = {label: [] for label in labels}
    for r in range(rounds):
        for label in labels[r % len(labels):] + labels[:r % len(labels)]:
            ts = []
            for _ in range(per_round):
                t0 = time.thread_time()
                steps[label]()
                ts.append(time.thread_time() - t0)
            out[label].append(statistics.median(ts))
    return out


# ---- the floor: the user's own hooks ----

def hooked_modules(model):
    return [m for m in model.modules() if next(m.parameters(recurse=False), None) is not None]


def leaves(out):
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, dict):
        for v in out.values():
            yield from leaves(v)
    elif isinstance(out, (tuple, list)):
        for v in out:
            yield from leaves(v)


def install_floor(model, grads=True, work=True):
    """Forward hooks doing o.sum() on each floating output leaf and, with grads, o.register_hook(g.sum());
    work=False: the same hooks doing nothing (PyTorch's own hook dispatch)."""
    def on_grad(g):
        if work:
            g.sum()

    def hook(m, args, out):
        for o in leaves(out):
            if o.is_floating_point():
                if work:
                    o.sum()
                if grads and o.requires_grad:
                    o.register_hook(on_grad)
    return [m.register_forward_hook(hook) for m in hooked_modules(model)]


def install_hookstats(model, op=True, **kwargs):
    import hookstats
    mon = hookstats.attach(model, **kwargs)
    if not op:  # the monitor's own hooks, the same calls; only the op becomes a no-op
        mon.store.update = lambda x, args: True
        mon.store.accumulate = lambda *a: None
    return mon


# ---- part "calls" ----

class Scale(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.w = nn.Parameter(torch.ones(n))

    def forward(self, x):
        return x * self.w


CALL_VARIANTS = {
    "no hooks": lambda m: None,
    "plain forward hook (nothing)": lambda m: install_floor(m, grads=False, work=False),
    "plain forward hook + o.register_hook (nothing)": lambda m: install_floor(m, grads=True, work=False),
    "floor forward hook (o.sum())": lambda m: install_floor(m, grads=False),
    "floor forward hook + o.register_hook (o.sum(), g.sum())": lambda m: install_floor(m),
    "plain full backward hook (nothing)": lambda m: [c.register_full_backward_hook(lambda *a: None) for c in m],
    "hookstats outputs only": lambda m: install_hookstats(m, grads=False),
    "hookstats outputs only, op a no-op": lambda m: install_hookstats(m, grads=False, op=False),
    "hookstats outputs + grads (defaults)": lambda m: install_hookstats(m),
    "hookstats outputs + grads, op a no-op": lambda m: install_hookstats(m, op=False),
}


def calls_part(rounds, chain, numel, per_round):
    x = torch.randn(1, numel)
    steps, keep = {}, []
    for label, install in CALL_VARIANTS.items():
        model = nn.Sequential(*[Scale(numel) for _ in range(chain)])
        keep.append(install(model))

        def step(model=model):
            model(x).sum().backward()
        steps[label] = step
    times = interleave(steps, rounds, per_round)
    us = {label: [1e6 * t / chain for t in ts] for label, ts in times.items()}  # per module call
    base, fwd, fwd_grad = us["no hooks"], us["plain forward hook (nothing)"], us["plain forward hook + o.register_hook (nothing)"]
    diff = lambda a, b: [p - q for p, q in zip(a, b)]  # noqa: E731
    out_hook, both = us["hookstats outputs only"], us["hookstats outputs + grads (defaults)"]
    out_noop, both_noop = us["hookstats outputs only, op a no-op"], us["hookstats outputs + grads, op a no-op"]
    res = {
        "us_per_module_call": {label: quartiles(v) for label, v in us.items()},
        "plain forward hook over no hooks": quartiles(diff(fwd, base)),
        "plain grad hook (register + call) over a plain forward hook": quartiles(diff(fwd_grad, fwd)),
        "output hook beyond a plain forward hook": quartiles(diff(out_hook, fwd)),
        "output hook beyond a plain forward hook, op a no-op": quartiles(diff(out_noop, fwd)),
        "gradient tap beyond a plain grad hook": quartiles([(b - o) - (fg - f) for b, o, fg, f in
                                                            zip(both, out_hook, fwd_grad, fwd)]),
        "gradient tap beyond a plain grad hook, op a no-op": quartiles([(b - o) - (fg - f) for b, o, fg, f in
                                                                       zip(both_noop, out_noop, fwd_grad, fwd)]),
    }
    if "floor forward hook (o.sum())" in us:
        ffwd, fboth = us["floor forward hook (o.sum())"], us["floor forward hook + o.register_hook (o.sum(), g.sum())"]
        res["output hook beyond the floor's forward hook (o.sum())"] = quartiles(diff(out_hook, ffwd))
        res["gradient tap beyond the floor's grad hook (g.sum())"] = quartiles([(b - o) - (fb - f) for b, o, fb, f in
                                                                               zip(both, out_hook, fboth, ffwd)])
    res["op alone, us per call"] = op_alone(numel, rounds)
    res["meeting a gradient, us per call (register in forward + fire in backward)"] = registration(numel, rounds)
    return res


def registration(numel, rounds, n=2000):
    """The ways PyTorch offers to meet an output's gradient, each registered on a fresh y = w * 2 and fired by
    y.sum().backward(), minus the same step without one."""
    w = torch.randn(numel, requires_grad=True)

    def nothing(*a):
        return None
    ways = {"none": lambda y: None, "Tensor.register_hook": lambda y: y.register_hook(nothing),
            "grad_fn.register_prehook": lambda y: y.grad_fn.register_prehook(nothing),
            "grad_fn.register_hook": lambda y: y.grad_fn.register_hook(nothing)}
    res = {k: [] for k in ways}
    for r in range(rounds):
        for k, way in ways.items():
            t0 = time.thread_time()
            for _ in range(n):
                y = w * 2
                way(y)
                y.sum().backward()
            res[k].append(1e6 * (time.thread_time() - t0) / n)
    return {k: quartiles([a - b for a, b in zip(v, res["none"])]) for k, v in res.items() if k != "none"}


def op_alone(numel, rounds, n=2000):
    from hookstats import accumulate
    from hookstats.config import StatsConfig
    from hookstats.state import Kind, StateStore, TargetKey
    store = StateStore(StatsConfig())
    st = store.state(TargetKey("a", Kind.OUTPUT), torch.device("cpu"), "train")
    x = torch.randn(numel)
    hist, no_hist = store.flag(torch.device("cpu")), torch.tensor([3], dtype=torch.uint8)  # 3: no histograms
    args_h = (st.fstate, st.istate, st.scratch, hist, StatsConfig().op_params())
    args_n = (st.fstate, st.istate, st.scratch, no_hist, StatsConfig().op_params())
    op, eager = torch.ops.hookstats.accumulate_.default, getattr(accumulate, "accumulate_eager_", None)
    cases = {"x.sum()": lambda: x.sum(),
             "torch.ops accumulate_, no histograms": lambda: op(x, *args_n),
             "torch.ops accumulate_, histograms": lambda: op(x, *args_h)}
    if eager is not None:
        cases["eager entry, no histograms"] = lambda: eager(x, *args_n)
        cases["eager entry, histograms"] = lambda: eager(x, *args_h)
        cases["StateStore.update, no histograms"] = lambda: store.update(x, args_n)
    big = torch.randn(2 ** 21)  # the size of the benchmark CNN's first outputs: where the per-value work shows
    large = {"x.sum(), 2M values": (lambda: big.sum(), 20),
             "torch.ops accumulate_, no histograms, 2M values": (lambda: op(big, *args_n), 20),
             "torch.ops accumulate_, histograms, 2M values": (lambda: op(big, *args_h), 20)}
    cases = {**{k: (f, n) for k, f in cases.items()}, **large}
    res = {k: [] for k in cases}
    for r in range(rounds):
        for k, (f, reps) in cases.items():
            t0 = time.thread_time()
            for _ in range(reps):
                f()
            res[k].append(1e6 * (time.thread_time() - t0) / reps)
    return {k: quartiles(v) for k, v in res.items()}


# ---- part "steps" ----

def make_gpt2(layers, seq=128, batch=2, optimizer=torch.optim.SGD, **config):
    """(model, step): GPT2LMHeadModel from GPT2Config(**config) (no download; layers=0: the config's 12 blocks),
    a batch of `batch` x `seq` tokens, the optimizer at lr 1e-4."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(**({"n_layer": layers} if layers else {}), **config)
    model = GPT2LMHeadModel(cfg)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq))
    opt = optimizer(model.parameters(), lr=1e-4)

    def step():
        model(ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    model.train()
    return model, step


def make(workload, gpt2_layers):
    if workload == "gpt2":
        return make_gpt2(gpt2_layers, attn_implementation="eager")
    from hookstats.tools.bench.models import make_workload
    return make_workload(workload)


STEP_VARIANTS = {
    "no hooks": lambda m: None,
    "floor": lambda m: install_floor(m),
    "floor, outputs only": lambda m: install_floor(m, grads=False),
    "hookstats defaults": lambda m: install_hookstats(m),
    "hookstats, histograms off": lambda m: install_hookstats(m, **NO_HISTOGRAMS),
    "hookstats outputs only, histograms off": lambda m: install_hookstats(m, grads=False, **NO_HISTOGRAMS),
}


def steps_part(workload, rounds, per_round, gpt2_layers):
    steps, keep = {}, []
    for label, install in STEP_VARIANTS.items():
        model, step = make(workload, gpt2_layers)
        keep.append(install(model))
        steps[label] = step
    times = interleave(steps, rounds, per_round)
    base = times["no hooks"]
    ratio = {label: [t / b for t, b in zip(ts, base)] for label, ts in times.items()}
    res = {"ms_per_step": {label: round(1e3 * statistics.median(ts), 2) for label, ts in times.items()},
           "ratio_to_no_hooks": {label: quartiles(r) for label, r in ratio.items()}}
    over = lambda a, b: [(p - 1) / (q - 1) for p, q in zip(ratio[a], ratio[b]) if q > 1]  # noqa: E731
    med = lambda label: statistics.median(ratio[label]) - 1  # noqa: E731
    res["overhead_over_floor_of_medians"] = {
        "defaults / floor": round(med("hookstats defaults") / med("floor"), 3),
        "histograms off / floor": round(med("hookstats, histograms off") / med("floor"), 3),
        "outputs only, histograms off / floor outputs only": round(
            med("hookstats outputs only, histograms off") / med("floor, outputs only"), 3)}
    added = lambda a, b: [1e3 * (p - q) for p, q in zip(times[a], times[b])]  # noqa: E731
    res["overhead_over_floor"] = {
        "defaults / floor": quartiles(over("hookstats defaults", "floor")),
        "histograms off / floor": quartiles(over("hookstats, histograms off", "floor")),
        "outputs only, histograms off / floor outputs only": quartiles(
            over("hookstats outputs only, histograms off", "floor, outputs only"))}
    res["ms_beyond_the_floor"] = {
        "defaults": quartiles(added("hookstats defaults", "floor")),
        "histograms off": quartiles(added("hookstats, histograms off", "floor")),
        "outputs only, histograms off": quartiles(added("hookstats outputs only, histograms off", "floor, outputs only"))}
    return res


def stat(q, unit):
    """One row's fields from quartiles(): the median and its IQR."""
    return {unit: q["median"], "q1": q["iqr"][0], "q3": q["iqr"][1], "rounds": q["n"]}


def table(part, results):
    """{row: {field: value}}. calls: one row per figure ("µs per module call: no hooks", "output hook beyond a plain
    forward hook", "op alone: x.sum()"), fields us, q1, q3, rounds. steps: "<workload>: <variant>" with step_ms and
    the ratio to no hooks; "<workload>: <variant> over the floor" with the ratio of overheads and ms beyond the floor."""
    out = {}
    if part == "calls":
        for name, v in results.items():
            if "median" in v:
                out[name] = stat(v, "us")
            else:
                group = "module call" if name == "us_per_module_call" else "op alone"
                out.update({f"{group}: {k}": stat(q, "us") for k, q in v.items()})
        return out
    for w, r in results.items():
        for v, q in r["ratio_to_no_hooks"].items():
            out[f"{w}: {v}"] = {"step_ms": r["ms_per_step"][v], **stat(q, "ratio")}
        for (v, q), (_, ms) in zip(r.get("overhead_over_floor", {}).items(), r.get("ms_beyond_the_floor", {}).items()):
            out[f"{w}: {v}"] = {**stat(q, "over_floor"), "ms_beyond_floor": ms["median"]}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=["calls", "steps"], required=True)
    ap.add_argument("--workloads", nargs="+", default=["cnn", "transformer", "gpt2"])
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--per-round", type=int, default=3, help="steps per variant per round (their median is taken)")
    ap.add_argument("--chain", type=int, default=64, help="part calls: modules in the chain")
    ap.add_argument("--numel", type=int, default=1024, help="part calls: values per tensor (1024 float32 = 4 KB)")
    ap.add_argument("--gpt2-layers", type=int, default=0, help="GPT-2 blocks (0: GPT2Config()'s 12)")
    ap.add_argument("--json", help="default: benchmarks/results/hook_overhead_<part>.json")
    ap.add_argument("--glibc-defaults", action="store_true", help="leave malloc's settings as they are")
    a = ap.parse_args()
    if not a.glibc_defaults and any(os.environ.get(k) != v for k, v in STABLE_MALLOC.items()):
        sys.exit(subprocess.call([sys.executable, *sys.argv], env={**os.environ, **STABLE_MALLOC}))
    torch.set_num_threads(1)
    import hookstats
    load = os.getloadavg()
    if a.part == "calls":
        results = calls_part(a.rounds, a.chain, a.numel, a.per_round)
        print(json.dumps(results, indent=1), flush=True)
    else:
        results = {}
        for w in a.workloads:
            results[w] = steps_part(w, a.rounds, a.per_round, a.gpt2_layers)
            print(w, json.dumps(results[w], indent=1), flush=True)
    path = a.json or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", f"hook_overhead_{a.part}.json")
    results_file.write(path, table(a.part, results),
                       results_file.machine(load_start=load[0]) + f", hookstats backend {hookstats.backend()}")


if __name__ == "__main__":
    main()
