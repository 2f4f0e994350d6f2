"""The steps of benchmarks/gpu_run.sh that run in Python, one per call, each under the shell's own timeout:

    python benchmarks/gpu_steps.py STEP --out DIR [--dry-run]

    correctness    the op against a float64 oracle computed on the device with torch (not the CPU kernel, which
                   shares accumulator.h): bin edges and values just below them, +-eps, -0, subnormals, NaN/Inf,
                   zeros, constants, 4 dtypes, odd offsets and sizes, strided views, one state from two streams,
                   accumulate_many_, a 2^31+7-element bf16 tensor, one block over 2^31-1 zeros; invariants after
                   every call (ticket re-armed; buckets + NaN/Inf == count)
    graphs         CUDA graphs: accumulate_many_, a strided view, enabled=3, nbins=256, a first-ever launch
                   inside a capture; replays against the oracle; ticket 0 after
    sanitize       small launches for compute-sanitizer (memcheck, racecheck)
    bandwidth      timed in CUDA graphs: bf16/fp32 at 256 MB and 1 GB on N(0,1), ReLU-like and zero data; float
                   buckets alone, all histograms, none, each against x.sum() of the same tensor; 4 KB and 1 MB
                   latency; accumulate_many_ over 64 x 256 KB; one strided view
    ncu-target     the launches ncu profiles: bf16 float buckets at 256 MB, N(0,1) then zeros
    train          GPT-2-small-shaped decoder (bench's SmallTransformer at 12 x 768) and bench's transformer in bf16
                   autocast: step time and peak memory of no hooks, hookstats' defaults and detach-to-CPU hooks,
                   interleaved; the planner's prediction beside the measurement

Each step writes DIR/steps/NAME.json (--name, default STEP) after every check ({"step", "status", "reason", "checks", "figures"}), so a
step cut by its timeout leaves what it did. --dry-run (no GPU): the CPU-possible part, small sizes on the CPU op.
"""
import argparse
import contextlib
import faulthandler
import glob
import json
import math
import os
import statistics
import sys
import time
import traceback

import torch

# The tree gpu_run.sh built the op in (its rehearsal builds in a copy), else this checkout.
ROOT = os.environ.get("GPU_RUN_TREE") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from hookstats import StatsConfig, layout, rawstate  # noqa: E402
from hookstats.state import scratch_bytes  # noqa: E402

F32_MAX = torch.finfo(torch.float32).max
DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


class Step:
    """A step's checks and figures, written to DIR/steps/NAME.json after each one."""

    def __init__(self, name, out):
        self.name, self.path = name, os.path.join(out, "steps", f"{name}.json")
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self.checks, self.figures, self.skipped = [], {}, None
        self.save()

    def check(self, ok, what):
        ok = bool(ok)
        print(f"- {'ok  ' if ok else 'FAIL'} {what}", flush=True)
        self.checks.append({"what": what, "ok": ok})
        self.save()
        return ok

    def figure(self, key, value, note=""):
        self.figures[key] = value
        print(f"  {key} = {value}{'  ' + note if note else ''}", flush=True)
        self.save()

    def skip(self, reason):
        self.skipped = reason
        print(f"- skipped: {reason}", flush=True)
        self.save()

    def status(self):
        if any(not c["ok"] for c in self.checks):
            return "failed"
        return "skipped" if self.skipped and not self.checks else "passed"

    def save(self):
        with open(self.path + ".tmp", "w") as f:
            json.dump({"step": self.name, "status": self.status() if hasattr(self, "checks") else "running",
                       "reason": self.skipped, "checks": self.checks, "figures": self.figures}, f, indent=1)
        os.replace(self.path + ".tmp", self.path)


# ---------------------------------------------------------------- state and the float64 oracle on the device
# The CUDA kernel's scratch for a grid of one block: the ticket's 64 bytes and one block's partial (kernel_plan.h
# BlockPartial: the shifted sums' n, K, s1, s2, then min and max, all float64).
ONE_BLOCK_SCRATCH = 64 + 6 * 8


def new_state(cfg, device, scratch=None):
    f = rawstate.empty(device=device)
    i = torch.zeros(cfg.istate_size, dtype=torch.int64, device=device)
    n = scratch_bytes(torch.device(device)) if scratch is None else scratch
    return f, i, torch.zeros(n, dtype=torch.uint8, device=device)


_ON = {}


def on_flag(device):
    """One enabled=True tensor per device, made once: a call inside a timed graph must add no kernel of its own."""
    key = str(torch.device(device))
    if key not in _ON:
        _ON[key] = torch.ones(1, dtype=torch.bool, device=device)
    return _ON[key]


def call(x, cfg, state, enabled=None):
    torch.ops.hookstats.accumulate_(x, *state, on_flag(x.device) if enabled is None else enabled, cfg.op_params())


def bin_values(v, dtype):
    """The float32 values the kernels bin and compare with eps (float64: huge clamped, tiny kept nonzero)."""
    if dtype != torch.float64:
        return v.float()
    f = torch.where(torch.isfinite(v), v.clamp(-F32_MAX, F32_MAX), v).float()
    tiny = torch.copysign(torch.full_like(f, 1e-45), f)
    return torch.where((f == 0) & (v != 0), tiny, f)


def float_slots(d):
    """Float bucket of each finite float64 value from its magnitude (frexp), as hookstats.layout numbers them."""
    half, below, above, zero = layout.FLOAT_HALF, layout.FLOAT_BELOW, layout.FLOAT_ABOVE, layout.FLOAT_ZERO
    a = d.abs()
    m, e = torch.frexp(a)
    normal = 8 * (e.double() - 1 + 127) + torch.floor((2 * m - 1) * 8)
    k = torch.where(a < 2.0 ** -126, torch.floor(a.clamp(max=1.0) * 2.0 ** 129), normal)
    k = torch.where(a >= 2.0 ** 128, float(above), torch.where(a < 2.0 ** -149, float(below), k))
    k = torch.where(a == 0, float(zero), k + (d < 0).double() * half)
    return k.long()


def oracle(x, cfg, chunk=2 ** 26):
    """(fstate, istate) of one call on x, in float64 and exact integers, computed with torch on x's device in
    chunks (a 2^31-element tensor fits): Chan-merged moments, counts, near-zero, linear bins, float buckets."""
    flags, nb = cfg.flags, cfg.nbins
    assert not (flags & layout.LOG_HIST and not flags & layout.FLOAT_HIST), "the oracle has no log2 slots"
    v = x.reshape(-1)
    dev = v.device
    n_all = v.numel()
    n, mean, m2, mn, mx = 0.0, 0.0, 0.0, math.nan, math.nan
    lin = torch.zeros(nb + 2, dtype=torch.int64, device=dev)
    flt = torch.zeros(layout.FLOAT_SLOTS, dtype=torch.int64, device=dev)
    nonfinite = [0, 0, 0]
    near = 0
    eps32 = torch.tensor(cfg.eps32, dtype=torch.float32, device=dev)
    for s in range(0, n_all, chunk):
        c = v[s:s + chunk]
        d = c.double()
        fin = torch.isfinite(d)
        df = d[fin]
        cn = df.numel()
        nonfinite[0] += int(torch.isnan(d).sum())
        nonfinite[1] += int(torch.isposinf(d).sum())
        nonfinite[2] += int(torch.isneginf(d).sum())
        b = bin_values(d, x.dtype)
        a = b if cfg.near_zero == "le" else b.abs()
        near += int((a <= eps32).sum())
        if cn:
            cmean = float(df.mean())
            cm2 = float(((df - cmean) ** 2).sum())
            delta, tot = cmean - mean, n + cn
            mean += delta * cn / tot
            m2 += cm2 + delta * delta * n * cn / tot
            n = tot
            mn = float(df.min()) if math.isnan(mn) else min(mn, float(df.min()))
            mx = float(df.max()) if math.isnan(mx) else max(mx, float(df.max()))
            if flags & layout.LINEAR_HIST:
                t = (b[fin] - torch.tensor(cfg.lo32, device=dev)) * torch.tensor(cfg.inv_w, dtype=torch.float32,
                                                                                  device=dev)
                lin += torch.bincount(torch.floor(t.clamp(-1, nb)).long() + 1, minlength=nb + 2)
            if flags & layout.FLOAT_HIST:
                flt += torch.bincount(float_slots(df), minlength=layout.FLOAT_SLOTS)
    f = torch.tensor([n, mean if n else 0.0, m2, mn, mx], dtype=torch.float64)
    i = torch.zeros(layout.istate_size(nb, flags), dtype=torch.int64)
    i[0], i[1] = n_all, near
    if flags & layout.LINEAR_HIST:
        i[layout.LIN_BASE:layout.LIN_BASE + nb + 2] = lin.cpu()
    nf = layout.nonfinite_base(nb, flags)
    i[nf:nf + 3] = torch.tensor(nonfinite)
    if flags & layout.FLOAT_HIST:
        fb = layout.float_base(nb, flags)
        i[fb:fb + layout.FLOAT_SLOTS] = flt.cpu()
    return f, i


def compare(step, state, want, calls, what, cfg):
    """State after `calls` calls on one x against `calls` x the oracle's one call, plus the invariants."""
    f, i, s = (t.cpu() for t in state)
    wf, wi = want
    bad = (i != wi * calls).nonzero().reshape(-1)
    ok_int = bad.numel() == 0
    ok_n = f[0] == calls * wf[0] and torch.equal(f[3:].isnan(), wf[3:].isnan()) and \
        torch.equal(f[3:].nan_to_num(), wf[3:].nan_to_num())
    std = math.sqrt(wf[2] / wf[0]) if wf[0] else 0.0
    ok_mean = wf[0] == 0 or abs(float(f[1] - wf[1])) <= 1e-7 * (abs(float(wf[1])) + std) + 1e-300
    ok_m2 = wf[0] == 0 or abs(float(f[2] - calls * wf[2])) <= 1e-6 * calls * float(wf[2]) + 1e-300
    detail = "" if ok_int else f"; istate slots {bad[:6].tolist()}: {i[bad[:6]].tolist()} vs {(wi * calls)[bad[:6]].tolist()}"
    step.check(ok_int and ok_n and ok_mean and ok_m2,
               f"{what}: integers {'equal' if ok_int else 'DIFFER'}, n/min/max {'equal' if ok_n else 'DIFFER'}, mean "
               f"{float(f[1]):.9g} vs {float(wf[1]):.9g}, M2 rel {abs(float(f[2] - calls * wf[2])) / max(calls * float(wf[2]), 1e-300):.1e}{detail}")
    invariants(step, state, cfg, what)


def invariants(step, state, cfg, what):
    f, i, s = (t.cpu() for t in state)
    flags, nb = cfg.flags, cfg.nbins
    ticket = int(s[:4].view(torch.int32)[0]) if s.numel() >= 4 else 0
    nf = layout.nonfinite_base(nb, flags)
    nonfinite = int(i[nf:nf + 3].sum())
    parts = [f"ticket {ticket}"]
    ok = ticket == 0
    if flags & layout.FLOAT_HIST:
        fb = layout.float_base(nb, flags)
        total = int(i[fb:fb + layout.FLOAT_SLOTS].sum()) + nonfinite
        ok &= total == int(i[0])
        parts.append(f"buckets + NaN/Inf {total} vs count {int(i[0])}")
    if flags & layout.LINEAR_HIST:
        total = int(i[layout.LIN_BASE:layout.LIN_BASE + nb + 2].sum()) + nonfinite
        ok &= total == int(i[0])
        parts.append(f"bins + NaN/Inf {total} vs count {int(i[0])}")
    ok &= int(f[0]) + nonfinite == int(i[0])
    step.check(ok, f"{what}: invariants ({'; '.join(parts)}; n_finite + NaN/Inf == count)")


# ---------------------------------------------------------------- inputs
def special_values(dtype, cfg):
    """Bin edges and the values just below them, +-eps and their neighbours, -0, subnormals, NaN, +-Inf, huge."""
    fin = torch.finfo(dtype)
    edges = torch.tensor(cfg.edges(), dtype=torch.float64).to(dtype) if cfg.linear_hist else torch.zeros(0, dtype=dtype)
    below = torch.nextafter(edges, torch.full_like(edges, -math.inf))
    eps = torch.tensor([cfg.eps32, -cfg.eps32], dtype=torch.float64).to(dtype)
    eps_n = torch.cat([torch.nextafter(eps, torch.full_like(eps, v)) for v in (math.inf, -math.inf)])
    sub = torch.tensor([fin.tiny / 2, -fin.tiny / 4, fin.tiny * fin.eps], dtype=torch.float64).to(dtype)
    powers = torch.tensor([2.0 ** k for k in range(-20, 20, 3)], dtype=torch.float64).to(dtype)
    huge = 1e150 if dtype == torch.float64 else fin.max  # float64's own max: no float64 algorithm keeps its M2
    other = torch.tensor([-0.0, 0.0, math.nan, math.inf, -math.inf, huge, -huge, fin.tiny, 1.0, -1.0],
                         dtype=torch.float64).to(dtype)
    return torch.cat([edges, below, eps, eps_n, sub, powers, -powers, other])


def adversarial(n, dtype, device, cfg, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64) * 2 + 0.5
    sp = special_values(dtype, cfg).double()
    idx = torch.randint(0, n, (min(n, 4 * sp.numel()),), generator=g)
    x[idx] = sp[torch.arange(idx.numel()) % sp.numel()]
    return x.to(dtype).to(device)


# ---------------------------------------------------------------- step 2
CFGS = {"defaults": StatsConfig(), "linear256": StatsConfig(nbins=256, lo=-4.0, hi=4.0, eps=1e-3)}


def correctness(step, device, dry):
    sizes = (1, 31, 4097, 10 ** 5 + 3) if dry else (1, 31, 4097, 10 ** 6 + 3, 2 ** 24 + 5)
    for cname, cfg in CFGS.items():
        for dtype in DTYPES:
            for n in sizes:
                x = adversarial(n + 8, dtype, device, cfg, seed=n)
                for vname, view in (("aligned", x[:n]), ("offset 1", x[1:n + 1]), ("offset 3", x[3:n + 3])):
                    st = new_state(cfg, device)
                    want = oracle(view, cfg)
                    for _ in range(2):
                        call(view, cfg, st)
                    compare(step, st, want, 2, f"{cname} {str(dtype)[6:]} n={n} {vname}, 2 calls", cfg)
            for data, x in (("zeros", torch.zeros(4099, dtype=dtype, device=device)),
                            ("constant", torch.full((4099,), 3.25, dtype=dtype, device=device))):
                st = new_state(cfg, device)
                call(x, cfg, st)
                compare(step, st, oracle(x, cfg), 1, f"{cname} {str(dtype)[6:]} {data}", cfg)
            base = adversarial(2 * 64 * 57 * 33, dtype, device, cfg, seed=9).view(2, 64, 57, 33)
            for vname, view in (("channels_last", base.contiguous(memory_format=torch.channels_last)),
                                ("every 3rd", base.reshape(-1)[::3]), ("sliced 4d", base[:, 3:40, ::2, 1:30]),
                                ("transposed", base[0, :, :, 0].t()), ("broadcast", base[0, 0, :, :1].expand(57, 40))):
                st = new_state(cfg, device)
                call(view, cfg, st)
                compare(step, st, oracle(view, cfg), 1, f"{cname} {str(dtype)[6:]} {vname}", cfg)
    many(step, device)
    if dry:
        step.figure("large tensors", "skipped (dry run)")
        return
    two_streams(step)
    cfg = CFGS["defaults"]
    x = torch.randn(2 ** 31 + 7, device=device, dtype=torch.bfloat16)
    x[::1000003] = math.nan
    st = new_state(cfg, device)
    want = oracle(x, cfg)
    for _ in range(2):
        call(x, cfg, st)
    compare(step, st, want, 2, "bf16 n=2^31+7 N(0,1) with NaNs, 2 calls", cfg)
    del x
    torch.cuda.empty_cache()
    # A scratch too small for one block is refused before any launch (the block would write past its end), and the
    # state is left as it was; one block's scratch is accepted.
    small = torch.zeros(4099, device=device, dtype=torch.bfloat16)
    for short in (0, ONE_BLOCK_SCRATCH - 1):
        st = new_state(cfg, device, scratch=short)
        before = [t.clone() for t in st[:2]]
        try:
            call(small, cfg, st)
            refused = ""
        except RuntimeError as e:
            refused = str(e)
        torch.cuda.synchronize()
        said = refused.splitlines()[0][:90] if refused else "accepted"
        step.check("scratch" in refused and all(torch.equal(a, b) for a, b in zip(before, st[:2])),
                   f"a {short}-byte scratch is refused, the state unchanged ({said})")
    # The one-block scratch on a small tensor first: the launcher's "scratch too small" warning runs here too, so a
    # crash in the large case below that this one does not share is the size's, not the warning's.
    st = new_state(cfg, device, scratch=ONE_BLOCK_SCRATCH)
    call(small, cfg, st)
    torch.cuda.synchronize()
    compare(step, st, oracle(small, cfg), 1, "bf16 4099 zeros in one block (the scratch warning's path)", cfg)
    print("one-block scratch, small tensor: ok; now 2^31-1 values in one block", file=sys.stderr, flush=True)
    x = torch.zeros(2 ** 31 - 1, device=device, dtype=torch.bfloat16)
    st = new_state(cfg, device, scratch=ONE_BLOCK_SCRATCH)  # one block takes it all
    call(x, cfg, st)
    compare(step, st, oracle(x, cfg), 1, "bf16 2^31-1 zeros in one block", cfg)


def many(step, device):
    for cname, cfg in CFGS.items():
        xs = [adversarial(n, d, device, cfg, seed=n) for n, d in ((5, torch.float32), (700, torch.bfloat16),
                                                                  (100003, torch.float16), (999, torch.float64))]
        xs += [adversarial(4000, torch.float32, device, cfg)[1::3], adversarial(33, torch.bfloat16, device, cfg)[1:]]
        xs += [adversarial(300 + k, torch.bfloat16, device, cfg, seed=k) for k in range(40)]  # > 32 of one dtype
        states = [new_state(cfg, device) for _ in xs]
        on = torch.ones(1, dtype=torch.bool, device=device)
        torch.ops.hookstats.accumulate_many_(xs, *[list(s) for s in zip(*states)], on, cfg.op_params())
        before = len(step.checks)
        for k, (x, st) in enumerate(zip(xs, states)):
            compare(step, st, oracle(x, cfg), 1, f"{cname} accumulate_many_ target {k}", cfg)
        ok = all(c["ok"] for c in step.checks[before:])
        del step.checks[before:]
        step.check(ok, f"{cname} accumulate_many_ over {len(xs)} tensors (4 dtypes, strided, offset) vs the oracle "
                       f"and invariants")


def two_streams(step):
    """One state, launches alternating between two streams with no order between them on the host: each waits for
    the other (stream_order.h)."""
    cfg = CFGS["defaults"]
    x = torch.randn(2 ** 24, device="cuda", dtype=torch.bfloat16)
    st = new_state(cfg, "cuda")
    on_flag("cuda")  # made on the current stream, before the others wait for it
    a, b = torch.cuda.Stream(), torch.cuda.Stream()
    for s in (a, b):
        s.wait_stream(torch.cuda.current_stream())
    for k in range(40):
        with torch.cuda.stream(a if k % 2 else b):
            call(x, cfg, st)
    torch.cuda.synchronize()
    compare(step, st, oracle(x, cfg), 40, "one state, 40 launches alternating between two streams", cfg)


# ---------------------------------------------------------------- step 3
def graphs(step, device, dry):
    if dry or device != "cuda":
        step.skip("CUDA graphs need a GPU (dry run)")
        return
    wide = StatsConfig(nbins=256, lo=-4.0, hi=4.0, eps=1e-3, linear_hist=True)
    # first-ever launch of this kernel instantiation (fp16, 256 linear bins + buckets), inside a capture
    x16 = adversarial(2 ** 20 + 3, torch.float16, "cuda", wide, seed=1)
    replay_check(step, "first-ever launch inside a capture (fp16, nbins=256)", wide, lambda st, on: call(x16, wide, st, on),
                 [(x16, 1)], warm=False)
    cfg = CFGS["defaults"]
    xb = adversarial(2 ** 20 + 5, torch.bfloat16, "cuda", cfg, seed=2)
    view = adversarial(3 * 2 ** 18, torch.float32, "cuda", cfg, seed=3).view(-1, 3)[:, 1:]
    replay_check(step, "bf16 dense, defaults", cfg, lambda st, on: call(xb, cfg, st, on), [(xb, 1)])
    replay_check(step, "strided view", cfg, lambda st, on: call(view, cfg, st, on), [(view, 1)])
    replay_check(step, "nbins=256 all histograms", wide, lambda st, on: call(xb, wide, st, on), [(xb, 1)])
    # enabled=3: on, without the histograms: count and moments move, buckets do not
    st = new_state(cfg, "cuda")
    on = torch.tensor([3], dtype=torch.int32, device="cuda")
    graph, side = capture(lambda: call(xb, cfg, st, on))
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    f, i, s = (t.cpu() for t in st)
    fb = layout.float_base(cfg.nbins, cfg.flags)
    want = oracle(xb, cfg)
    step.check(int(i[0]) == 5 * xb.numel() and int(i[fb:fb + layout.FLOAT_SLOTS].sum()) == 0 and
               float(f[0]) == 5 * float(want[0][0]) and int(s[:4].view(torch.int32)[0]) == 0,
               f"enabled=3 in a graph, 5 replays: count {int(i[0])}, buckets {int(i[fb:fb + layout.FLOAT_SLOTS].sum())} "
               f"(0), ticket 0")
    # accumulate_many_ captured: 3 dtypes and a strided entry
    xs = [xb, view, adversarial(999, torch.float64, "cuda", cfg), adversarial(77, torch.float16, "cuda", cfg)]
    states = [new_state(cfg, "cuda") for _ in xs]
    on = torch.ones(1, dtype=torch.bool, device="cuda")
    torch.ops.hookstats.accumulate_many_(xs, *[list(s) for s in zip(*[new_state(cfg, "cuda") for _ in xs])], on,
                                         cfg.op_params())  # warm-up, other states
    graph, _ = capture(lambda: torch.ops.hookstats.accumulate_many_(xs, *[list(s) for s in zip(*states)], on,
                                                                   cfg.op_params()))
    for _ in range(4):
        graph.replay()
    on.fill_(False)
    for _ in range(2):
        graph.replay()
    torch.cuda.synchronize()
    before = len(step.checks)
    for k, (x, st) in enumerate(zip(xs, states)):
        compare(step, st, oracle(x, cfg), 4, f"captured accumulate_many_ target {k}", cfg)
    ok = all(c["ok"] for c in step.checks[before:])
    del step.checks[before:]
    step.check(ok, "accumulate_many_ captured (4 dtypes and layouts), 4 replays + 2 disabled == 4 calls, invariants")


def capture(fn):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    return graph, side


def replay_check(step, what, cfg, fn, xs, warm=True, replays=6):
    on = torch.ones(1, dtype=torch.bool, device="cuda")
    if warm:
        fn(new_state(cfg, "cuda"), on)
    st = new_state(cfg, "cuda")
    graph, _ = capture(lambda: fn(st, on))
    torch.cuda.synchronize()
    step.check(int(st[1].count_nonzero()) == 0, f"{what}: the capture alone changes no state")
    for _ in range(replays):
        graph.replay()
    on.fill_(False)
    graph.replay()
    torch.cuda.synchronize()
    x, _k = xs[0]
    compare(step, st, oracle(x, cfg), replays, f"{what}: {replays} replays (+1 disabled)", cfg)


# ---------------------------------------------------------------- step 4
def sanitize(step, device, dry):
    """Small launches (dense 1 and many blocks, offset, strided, multi-tensor, nbins=256, two streams)."""
    wide = StatsConfig(nbins=256, lo=-4.0, hi=4.0, eps=1e-3)
    for cname, cfg in (*CFGS.items(), ("wide", wide)):
        for dtype in DTYPES:
            x = adversarial(7 * 40001, dtype, device, cfg)
            for view in (x[:31], x[1:], x[: 2 ** 16], x.view(-1, 7)[:, 1:5]):
                st = new_state(cfg, device)
                call(view, cfg, st)
                call(view, cfg, st)
        xs = [adversarial(n, torch.float32, device, cfg) for n in (5, 700, 100000)]
        states = [new_state(cfg, device) for _ in xs]
        torch.ops.hookstats.accumulate_many_(xs, *[list(s) for s in zip(*states)],
                                             torch.ones(1, dtype=torch.bool, device=device), cfg.op_params())
    if device == "cuda":
        two_streams_small = new_state(CFGS["defaults"], device)
        x = torch.randn(2 ** 18, device=device)
        on_flag(device)
        a, b = torch.cuda.Stream(), torch.cuda.Stream()
        for s in (a, b):
            s.wait_stream(torch.cuda.current_stream())
        for k in range(6):
            with torch.cuda.stream(a if k % 2 else b):
                call(x, CFGS["defaults"], two_streams_small)
        torch.cuda.synchronize()
    step.check(True, "sanitizer workload ran")


# ---------------------------------------------------------------- step 5
def timed(fn, reps, device):
    """ms per fn() call: CUDA events around `reps` calls (fn replays a graph), or perf_counter on CPU."""
    fn()
    if device != "cuda":
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        return 1e3 * (time.perf_counter() - t) / reps
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps


def per_call_ms(fn, calls, device, reps=5):
    """ms per call of fn, `calls` calls captured in one CUDA graph (host dispatch not counted); eager on CPU."""
    if device != "cuda":
        return timed(fn, calls * reps, device)
    fn()
    torch.cuda.synchronize()
    graph, _ = capture(lambda: [fn() for _ in range(calls)])
    return timed(graph.replay, reps, device) / calls


def skip_flag(device):
    """The flag of a step without histograms (hist_every): enabled, kSkipHist set."""
    return torch.tensor([1 | layout.SKIP_HIST], dtype=torch.uint8, device=device)


VARIANTS = {"float buckets": StatsConfig(),
            "float buckets, skip step": StatsConfig(),
            "all histograms": StatsConfig(nbins=64, lo=-4.0, hi=4.0, linear_hist=True, log_hist=True),
            "none": StatsConfig(linear_hist=False, log_hist=False, float_hist=False)}


def bandwidth(step, device, dry):
    mbs = (1,) if dry else (256, 1024)
    for dtype in (torch.bfloat16, torch.float32):
        for mb in mbs:
            n = mb * 2 ** 20 // torch.empty(0, dtype=dtype).element_size()
            x = torch.randn(n, device=device).to(dtype)
            out = torch.empty((), device=device, dtype=torch.float32)
            for data in ("N(0,1)", "ReLU-like", "zeros"):
                if data == "ReLU-like":
                    x.clamp_(min=0)
                elif data == "zeros":
                    x.zero_()
                calls = 2 if dry else max(3, min(20, 2 ** 32 // (mb * 2 ** 20)))
                sum_ms = per_call_ms(lambda: torch.sum(x, 0, dtype=torch.float32, out=out), calls, device)
                sum_gbs = mb * 2 ** 20 / sum_ms / 1e6
                step.figure(f"sum/{str(dtype)[6:]}/{mb}MB/{data}", round(sum_gbs, 1), "GB/s (x.sum(): the read limit)")
                for vname, cfg in VARIANTS.items():
                    st = new_state(cfg, device)
                    flag = skip_flag(device) if vname == "float buckets, skip step" else None
                    ms = per_call_ms(lambda: call(x, cfg, st, flag), calls, device)
                    gbs = mb * 2 ** 20 / ms / 1e6
                    step.figure(f"op/{str(dtype)[6:]}/{mb}MB/{data}/{vname}", round(gbs, 1),
                                f"GB/s = {gbs / sum_gbs:.0%} of x.sum()")
                    step.figure(f"ratio/{str(dtype)[6:]}/{mb}MB/{data}/{vname}", round(gbs / sum_gbs, 3))
            del x
            if device == "cuda":
                torch.cuda.empty_cache()
    cfg = VARIANTS["float buckets"]
    for dtype in (torch.bfloat16, torch.float32):
        for nbytes in (4096, 2 ** 20):
            x = torch.randn(nbytes // torch.empty(0, dtype=dtype).element_size(), device=device).to(dtype)
            st = new_state(cfg, device)
            us = 1e3 * per_call_ms(lambda: call(x, cfg, st), 20, device, reps=20)
            step.figure(f"latency/{str(dtype)[6:]}/{nbytes // 1024}KB", round(us, 2), "us per call in a CUDA graph")
    xs = [torch.randn(2 ** 17, device=device).to(torch.bfloat16) for _ in range(64)]  # 64 x 256 KB
    states = [new_state(cfg, device) for _ in xs]
    on = on_flag(device)
    lists = [list(s) for s in zip(*states)]
    us = 1e3 * per_call_ms(lambda: torch.ops.hookstats.accumulate_many_(xs, *lists, on, cfg.op_params()), 5, device)
    step.figure("many/64x256KB/bf16", round(us, 2), f"us per accumulate_many_ call = {64 * 2 ** 18 / us / 1e3:.0f} GB/s")
    us1 = 1e3 * per_call_ms(lambda: [call(x, cfg, s) for x, s in zip(xs, states)], 2, device)
    step.figure("many/64x256KB/bf16/one call each", round(us1, 2), "us for 64 accumulate_ calls")
    big = torch.randn((1 if dry else 128) * 2 ** 20 // 2, device=device).to(torch.bfloat16).view(-1, 256)
    view = big[:, ::2]
    st = new_state(cfg, device)
    ms = per_call_ms(lambda: call(view, cfg, st), 3, device)
    sum_ms = per_call_ms(lambda: view.sum(dtype=torch.float32), 3, device)
    step.figure("strided/bf16/every 2nd column", round(view.numel() * 2 / ms / 1e6, 1),
                f"GB/s of the view's values; x.sum() of the view {view.numel() * 2 / sum_ms / 1e6:.1f} GB/s")
    step.check(True, "bandwidth figures measured" + (" (dry run: CPU, 1 MB, no graphs: not comparable)" if dry else ""))


# ---------------------------------------------------------------- step 6
def ncu_target(step, device, dry):
    cfg = VARIANTS["float buckets"]
    x = torch.randn((1 if dry else 256) * 2 ** 20 // 2, device=device).to(torch.bfloat16)
    for data in ("N(0,1)", "zeros"):
        if data == "zeros":
            x.zero_()
        st = new_state(cfg, device)
        call(x, cfg, st)
    if device == "cuda":
        torch.cuda.synchronize()
    step.check(True, "ncu workload ran (bf16, float buckets, 256 MB: N(0,1), then zeros)")


# ---------------------------------------------------------------- step 7
def detach_hooks(model):
    """The detach-to-CPU baseline: every hooked module's output copied to the host each step (the last kept)."""
    kept = {}

    def keep(m, i, o):
        if isinstance(o, torch.Tensor):
            kept[id(m)] = o.detach().to("cpu", non_blocking=False)
    hs = [m.register_forward_hook(keep) for m in model.modules() if any(True for _ in m.parameters(recurse=False))]
    return hs, kept


def rss_mb():
    """This process's resident host memory, MB (Linux)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def build_model(name, m, device):
    """GPT-2 small as Hugging Face builds it (no download) when transformers is here, else the bench transformer.
    Returns (model, forward: ids -> logits)."""
    if name.startswith("gpt2"):
        try:
            from transformers import GPT2Config, GPT2LMHeadModel
            cfg = GPT2Config(n_layer=m["blocks"], n_embd=m["d"], n_head=m["heads"], vocab_size=m["vocab"],
                             n_positions=m["seq"])
            model = GPT2LMHeadModel(cfg).to(device)
            return model, (lambda ids: model(ids, use_cache=False).logits), "transformers GPT2LMHeadModel"
        except Exception as e:  # noqa: BLE001  (no transformers, or one that cannot build it: the bench model)
            print(f"  GPT-2 from transformers unavailable ({type(e).__name__}: {e}): the bench transformer")
    from hookstats.tools.bench.models import SmallTransformer
    model = SmallTransformer(m["blocks"], m["d"], m["heads"], m["vocab"], m["seq"]).to(device)
    return model, model, "hookstats SmallTransformer"


def syncs_in_step(one_step, device):
    """None when one training step runs with torch.cuda.set_sync_debug_mode('error'), else what synced."""
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        one_step()
    except RuntimeError as e:
        where = [f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in traceback.extract_tb(e.__traceback__)]
        return str(e).splitlines()[0][:120] + " at " + " <- ".join(reversed(where[-3:]))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return None


def op_kernel_time(step, name, one_step, device, steps=2):
    """The op's own GPU time per training step (its kernels in torch.profiler), and how many it launched: the
    step's overhead beyond it is host time or waiting."""
    if device != "cuda":
        return
    from torch.profiler import ProfilerActivity, profile
    sync = torch.cuda.synchronize
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            one_step()
        sync()
    avg = prof.key_averages()
    dev_t = lambda e: getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)  # noqa: E731
    ours = [e for e in avg if "dense_kernel" in e.key or "strided_kernel" in e.key]
    calls = sum(e.count for e in ours)
    step.figure(f"{name}/op kernels per step", calls / steps)
    step.figure(f"{name}/op kernel ms per step", round(sum(dev_t(e) for e in ours) / steps / 1e3, 3),
                "the op's GPU time (torch.profiler)")
    if calls:
        step.figure(f"{name}/op kernel us per launch", round(sum(dev_t(e) for e in ours) / calls, 2))
    host = [e for e in avg if e.key == "hookstats::accumulate_"]
    if host and host[0].count:
        step.figure(f"{name}/op host us per call", round(host[0].cpu_time_total / host[0].count, 2),
                    "CPU time of hookstats::accumulate_ (dispatch, checks, launch)")


def train(step, device, dry):
    import hookstats
    from hookstats.tools.planner import plan
    models = {"gpt2-small": dict(blocks=12, d=768, heads=12, vocab=50257, seq=1024, batch=8),
              "transformer": dict(blocks=4, d=256, heads=4, vocab=1000, seq=128, batch=16)}
    if dry:
        models = {"tiny": dict(blocks=2, d=64, heads=2, vocab=100, seq=32, batch=2)}
    rounds, steps = (1, 2) if dry else (3, 10)  # any 10 consecutive steps hold one histogram step (hist_every=10)
    for name, m in models.items():
        torch.manual_seed(0)
        model, forward, built = build_model(name, m, device)
        step.figure(f"{name}/model", built)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        ids = torch.randint(0, m["vocab"], (m["batch"], m["seq"]), device=device)

        def one_step():
            with torch.autocast(device_type=device, dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(forward(ids).flatten(0, 1).float(), ids.flatten())
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        def sync():
            if device == "cuda":
                torch.cuda.synchronize()

        times = {v: [] for v in ("none", "hookstats defaults", "detach-to-CPU")}
        peak, host = {}, {}
        for r in range(rounds):
            for v in times:
                mon, hs = None, []
                rss0 = rss_mb()
                if v == "hookstats defaults":
                    mon = hookstats.attach(model)
                elif v == "detach-to-CPU":
                    hs, kept = detach_hooks(model)
                one_step()  # warm-up (allocations, first launches)
                sync()
                if r == 0 and v != "detach-to-CPU":
                    synced = syncs_in_step(one_step, device)
                    step.check(synced is None, f"{name}: a training step with {v} makes no host sync"
                               + ("" if synced is None else f" ({synced})"))
                if device == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                t = time.perf_counter()
                for _ in range(steps):
                    one_step()
                sync()
                times[v].append((time.perf_counter() - t) / steps)
                if device == "cuda":
                    peak[v] = max(peak.get(v, 0), torch.cuda.max_memory_allocated())
                if rss0 is not None:
                    host[v] = max(host.get(v, 0), rss_mb() - rss0)
                if mon is not None:
                    if r == 0:
                        step.figure(f"{name}/hookstats targets", len(mon.stats()))
                        op_kernel_time(step, name, one_step, device)
                    mon.remove()
                for h in hs:
                    h.remove()
        base = statistics.median(times["none"])
        step.figure(f"{name}/step ms/none", round(1e3 * base, 3))
        for v in times:
            med = statistics.median(times[v])
            ratios = [t / b for t, b in zip(times[v], times["none"])]
            step.figure(f"{name}/step ms/{v}", round(1e3 * med, 3),
                        f"overhead {statistics.median(ratios) - 1:+.1%} (rounds {[round(q - 1, 3) for q in ratios]})")
            step.figure(f"{name}/overhead/{v}", round(statistics.median(ratios) - 1, 4))
            if v in peak:
                step.figure(f"{name}/peak MB/{v}", round(peak[v] / 2 ** 20, 1))
            if v in host:
                step.figure(f"{name}/host MB added/{v}", round(host[v], 1), "resident host memory over the step's")
        try:
            p = plan(model, ids, loss_fn=lambda out: getattr(out, "logits", out).float().logsumexp(-1).mean(),
                     speed="cuda")
            pred = p.predict(step_time=base)
        except Exception as e:  # noqa: BLE001  (the planner's failure is a finding, the figures above stand)
            step.check(False, f"{name}: plan() raised {type(e).__name__}: {str(e)[:160]}")
            traceback.print_exc()
            continue
        step.figure(f"{name}/plan/op us per step", None if p.op_seconds is None else round(p.op_seconds * 1e6, 1))
        step.figure(f"{name}/plan/overhead", None if pred.get("overhead") is None else round(pred["overhead"], 4),
                    "predicted from the H100 table and the measured step time")
    step.check(True, "training steps measured" + (" (dry run: tiny model on CPU)" if dry else ""))


STEPS = {"correctness": correctness, "graphs": graphs, "sanitize": sanitize, "bandwidth": bandwidth,
         "ncu-target": ncu_target, "train": train}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("step", choices=sorted(STEPS))
    ap.add_argument("--out", required=True, help="the run's output folder (results go to OUT/steps/STEP.json)")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: small sizes on the CPU op")
    ap.add_argument("--name", help="the step's name in the report (default: STEP)")
    a = ap.parse_args(argv)
    faulthandler.enable()  # a crash in native code prints the Python line that made it
    device = "cpu" if a.dry_run else "cuda"
    if not a.dry_run and not torch.cuda.is_available():
        ap.error("no CUDA device: use --dry-run")
    step = Step(a.name or a.step, a.out)
    built = glob.glob(os.path.join(ROOT, "hookstats", "_C*.so")) or \
        [m for m in [os.path.join(a.out, "first_use_build")] if os.path.exists(m)]
    if not built:  # importing hookstats would compile the op on first use, inside this step's timeout
        step.check(False, f"the op is not built in {ROOT} (step 1-build builds it; a step never compiles it)")
        return 1
    import hookstats
    if hookstats.backend() != "compiled" or (device == "cuda" and not hookstats.accumulate.has_cuda_kernel()):
        step.check(False, f"the compiled op with its {device} kernel is not loaded (backend {hookstats.backend()})")
        return 1
    try:
        STEPS[a.step](step, device, a.dry_run)
    except Exception:  # noqa: BLE001  (the step's failure goes to its report; the run goes on)
        step.check(False, "raised: " + traceback.format_exc(limit=4).strip().splitlines()[-1])
        traceback.print_exc()
    return 0 if step.status() != "failed" else 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
