"""GPU checks of the CUDA kernel, for a machine that has a GPU (and `--sass` static figures for one without).

    python benchmarks/gpu_check.py            correctness vs the CPU kernel, determinism, CUDA graph replay,
                                              multi-tensor launch, the monitor on a CUDA model, the GPU-only
                                              pytest cases, compute-sanitizer, bandwidth sweep
    python benchmarks/gpu_check.py --quick    the same with sizes up to 2**24 and a short sweep
    python benchmarks/gpu_check.py --sass     no GPU: hot-loop SASS instructions per element (nvcc, cuobjdump)

Every check runs with the old default histograms (linear + log2) and with the float buckets alone (FLOAT_HIST,
the new default): their buckets against an oracle from the values' magnitudes (and the whole state against the
CPU kernel once it takes FLOAT_HIST), graph replays, the bandwidth sweep (targets: bf16 >= 75%, fp32 >= 90%
of copy bandwidth at >= 64 MB) and the 1 MB graph latency (< 8 us).

Needs hookstats built with its CUDA kernel (torch with CUDA, nvcc; see .ci/cuda_build.sh). Prints markdown
tables of what it measured; exits non-zero if a correctness check fails.
"""
import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS for the bitwise checks
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAILED = []


def report(ok, what):
    print(f"- {'ok  ' if ok else 'FAIL'} {what}", flush=True)
    if not ok:
        FAILED.append(what)


class WithFlags:
    """A StatsConfig whose op flags are set here (FLOAT_HIST, the linear and log2 histograms dropped or kept):
    the op_params / istate_size interface of StatsConfig."""

    def __init__(self, cfg, flags):
        self.cfg, self.flags = cfg, flags

    def __getattr__(self, name):
        return getattr(self.cfg, name)

    @property
    def istate_size(self):
        from hookstats import layout
        return layout.istate_size(self.cfg.nbins, self.flags)

    def op_params(self):
        from hookstats import layout
        return layout.op_params(*self.cfg.op_params()[:-1], self.flags)


def float_only(cfg):
    """The default: float buckets alone (no linear, no log2 histogram), cfg's near-zero rule."""
    from hookstats import layout
    return WithFlags(cfg, layout.FLOAT_HIST | (cfg.flags & layout.SIGNED_NEAR_ZERO))


def cpu_takes(cfg):
    """Whether the CPU kernel accepts cfg's flags (FLOAT_HIST on every current build)."""
    try:
        run(torch.zeros(3), cfg)
    except RuntimeError:
        return False
    return True


# ---------------------------------------------------------------- correctness
def adversarial(n, dtype, device, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float32) * 2 + 3
    for start, step, value in ((0, 97, 0.0), (1, 101, 1e-7), (4, 211, 3e4), (5, 499, float("nan")),
                               (6, 503, float("inf")), (7, 509, -float("inf"))):
        x[start::step] = value
    x[::4099] = -1e-40 if dtype != torch.float16 else -1e-6
    if dtype != torch.float16:
        x[9::401] = 1e30  # its fp32 square overflows: the chunk is redone in fp64 (fp16: it would be inf)
    return x.to(dtype).to(device)


def new_state(cfg, device):
    from hookstats.state import scratch_bytes
    from hookstats.rawstate import empty
    f, i = empty(cfg.istate_size, device=device)
    s = torch.zeros(scratch_bytes(torch.device(device)), dtype=torch.uint8, device=device)
    return f, i, s


def run(x, cfg, calls=1, state=None, enabled=None):
    f, i, s = state or new_state(cfg, x.device)
    on = enabled if enabled is not None else torch.tensor([True], device=x.device)
    for _ in range(calls):
        torch.ops.hookstats.accumulate_(x, f, i, s, on, cfg.op_params())
    return f, i, s


def same_stats(g, c, what):
    (gf, gi, _), (cf, ci, _) = g, c
    gf, gi, cf, ci = gf.cpu().numpy(), gi.cpu().numpy(), cf.numpy(), ci.numpy()
    ints = np.array_equal(gi, ci)
    n_ok = gf[0] == cf[0] and np.array_equal(gf[3:], cf[3:], equal_nan=True)
    scale = abs(cf[1]) + np.sqrt(cf[2] / max(cf[0], 1))
    mean_ok = abs(gf[1] - cf[1]) <= 1e-6 * scale + 1e-300
    m2_ok = abs(gf[2] - cf[2]) <= 1e-5 * abs(cf[2]) + 1e-300
    report(ints and n_ok and mean_ok and m2_ok,
           f"{what}: integers {'equal' if ints else 'DIFFER'}; mean {gf[1]:.9g} vs CPU {cf[1]:.9g}; "
           f"M2 rel diff {abs(gf[2] - cf[2]) / max(abs(cf[2]), 1e-300):.2e}")


def check_correctness(cfg, quick):
    sizes = [1, 31, 4097, 10**6 + 3] + ([] if quick else [2**24 + 5, 2**28])
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        for n in sizes:
            if n == 2**28 and dtype in (torch.float16, torch.float64):
                continue
            x = adversarial(n + 1, dtype, "cuda", seed=n)
            for name, view in (("aligned", x[:n]), ("misaligned", x[1:])):
                same_stats(run(view, cfg, calls=2), run(view.cpu(), cfg, calls=2),
                           f"{dtype} n={view.numel()} {name}, 2 calls")
            del x
            torch.cuda.empty_cache()
    for dtype in (torch.float32, torch.bfloat16):  # vanishing values: fp32 squares underflow, chunks redone in fp64
        for scale, offset in ((1e-25, 0.0), (1e-40, 0.0), (1e-22, 1e-20)):
            g = torch.Generator().manual_seed(1)
            x = (offset + scale * torch.randn(10**6 + 3, generator=g, dtype=torch.float64)).to(dtype)
            same_stats(run(x.cuda(), cfg, calls=2), run(x, cfg, calls=2),
                       f"{dtype} vanishing values {offset:g} + {scale:g} N(0, 1), 2 calls")
    x = adversarial(2 * 64 * 57 * 33, torch.float32, "cuda").view(2, 64, 57, 33)
    for name, view in (("channels_last", x.contiguous(memory_format=torch.channels_last)),
                       ("transposed", x.transpose(1, 3)), ("sliced", x[:, 3:40, ::2, 1:]),
                       ("broadcast", x[:1, :1].expand(5, 64, 57, 33))):
        same_stats(run(view, cfg), run(view.cpu(), cfg), f"{name} view {tuple(view.shape)}")


def check_float_buckets(cfg, quick, device="cuda"):
    """FLOAT_HIST on the GPU: the buckets equal an oracle computed from each value's float64 magnitude
    (tests/float_oracle.py float_buckets) on every dtype, aligned and misaligned, 2 calls; the rest of the
    state equals the CPU kernel's (all of it once the CPU kernel takes FLOAT_HIST); graph replays == eager."""
    from hookstats import layout
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from float_oracle import float_buckets
    from test_cuda_emulation import bucket_values
    fcfg = WithFlags(cfg, cfg.flags | layout.FLOAT_HIST)
    whole = cpu_takes(fcfg)
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        for n in [31, 4097, 10**6 + 3] + ([] if quick else [2**26 + 5]):
            x = bucket_values(n + 1, dtype, seed=n).to(device)
            for name, view in (("aligned", x[:n]), ("misaligned", x[1:])):
                for c in (fcfg, float_only(cfg)):
                    fb = layout.float_base(c.nbins, c.flags)  # the buckets follow what c's flags measure
                    f, i, _ = run(view, c, calls=2)
                    i = i.cpu().numpy()
                    want = 2 * float_buckets(view.cpu())
                    cf, ci, _ = run(view.cpu(), c if whole else WithFlags(cfg, c.flags & ~layout.FLOAT_HIST), calls=2)
                    rest = np.array_equal(i if whole else i[:fb], ci.numpy())
                    report(np.array_equal(i[fb:], want) and rest,
                           f"FLOAT_HIST flags={c.flags} {dtype} n={view.numel()} {name}, 2 calls: buckets "
                           f"{'equal' if np.array_equal(i[fb:], want) else 'DIFFER from'} the oracle; the rest "
                           f"{'equals' if rest else 'DIFFERS from'} the CPU kernel{'' if whole else ' (without FLOAT_HIST)'}")
    x = bucket_values(2 * 64 * 57 * 33, torch.bfloat16, seed=9).to(device).view(2, 64, 57, 33)
    for name, view in (("transposed", x.transpose(1, 3)), ("sliced", x[:, 3:40, ::2, 1:]),
                       ("broadcast", x[:1, :1].expand(5, 64, 57, 33))):
        i = run(view, float_only(cfg))[1].cpu().numpy()
        fb = layout.float_base(cfg.nbins, float_only(cfg).flags)
        report(np.array_equal(i[fb:], float_buckets(view.cpu())), f"FLOAT_HIST alone, bf16 {name} view: buckets "
               f"{'equal' if np.array_equal(i[fb:], float_buckets(view.cpu())) else 'DIFFER from'} the oracle")
    check_graph(float_only(cfg))


def check_determinism(cfg):
    x = adversarial(10**7 + 7, torch.float32, "cuda", seed=3)
    a, b = run(x, cfg), run(x, cfg)
    report(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), "two runs give bitwise identical states")


def check_graph(cfg, replays=7):
    x = adversarial(2**20 + 3, torch.bfloat16, "cuda", seed=4)
    on = torch.tensor([True], device="cuda")
    state = new_state(cfg, "cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        run(x, cfg, state=new_state(cfg, "cuda"), enabled=on)  # warm-up outside the graph
        with torch.cuda.graph(graph, stream=stream):
            run(x, cfg, state=state, enabled=on)
    torch.cuda.current_stream().wait_stream(stream)
    f0, i0 = state[0].clone(), state[1].clone()  # capture does not execute
    for _ in range(replays):
        graph.replay()
    on.fill_(False)
    for _ in range(3):  # sampling inside the graph: disabled replays change nothing
        graph.replay()
    torch.cuda.synchronize()
    eager = run(x, cfg, calls=replays)
    report(torch.equal(f0.isnan(), torch.tensor([False, False, False, True, True], device="cuda")) and not i0.any(),
           "capture alone does not change the state")
    report(torch.equal(state[0], eager[0]) and torch.equal(state[1], eager[1]),
           f"{replays} graph replays (+3 disabled) == {replays} eager calls, bitwise")
    report(int(state[2][:4].view(torch.int32).item()) == 0, "ticket re-armed after replays")


def check_many(cfg):
    xs = [adversarial(n, torch.float32, "cuda", seed=n) for n in range(1, 3000, 37)]
    xs += [adversarial(2**20, torch.bfloat16, "cuda"), adversarial(999, torch.float64, "cuda")[::2]]
    states = [new_state(cfg, "cuda") for _ in xs]
    on = torch.tensor([True], device="cuda")
    torch.ops.hookstats.accumulate_many_(xs, *[list(s) for s in zip(*states)], on, cfg.op_params())
    ok = all(torch.equal(s[1], run(x, cfg)[1]) and torch.allclose(s[0], run(x, cfg)[0], rtol=1e-9, equal_nan=True)
             for x, s in zip(xs, states))
    report(ok, f"accumulate_many_ over {len(xs)} tensors (3 dtypes, one strided) == one call per tensor")


def check_sanitizer():
    exe = shutil.which("compute-sanitizer")
    if exe is None:
        cand = os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "cu13", "bin", "compute-sanitizer")
        exe = cand if os.path.exists(cand) else None
    if exe is None:
        report(False, "compute-sanitizer not found (pip install nvidia-cuda-sanitizer-api)")
        return
    for tool in ("memcheck", "racecheck", "synccheck"):
        r = subprocess.run([exe, f"--tool={tool}", "--error-exitcode=3", sys.executable, __file__, "--sanitize-target"],
                           capture_output=True, text=True, timeout=1800)
        summary = [ln for ln in r.stdout.splitlines() if "ERROR SUMMARY" in ln or "RACECHECK SUMMARY" in ln]
        report(r.returncode == 0, f"compute-sanitizer --tool={tool}: {summary[-1] if summary else r.stdout[-300:]}")


def sanitize_target(cfg):
    """Small launches for compute-sanitizer: dense (1 and many blocks), misaligned, strided, multi-tensor; with
    the old default histograms, the float buckets alone, and every histogram at nbins=256 (> 48 KB of shared
    memory per block)."""
    from hookstats import StatsConfig, layout
    wide = StatsConfig(nbins=256, lo=cfg.lo, hi=cfg.hi, eps=cfg.eps)
    for c in (cfg, float_only(cfg), WithFlags(wide, wide.flags | layout.FLOAT_HIST)):
        for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
            x = adversarial(7 * 40001, dtype, "cuda")
            for view in (x[:31], x[1:], x[: 2**16], x.view(-1, 7)[:, 1:5]):
                run(view, c, calls=2)
        xs = [adversarial(n, torch.float32, "cuda") for n in (5, 700, 100000)]
        states = [new_state(c, "cuda") for _ in xs]
        torch.ops.hookstats.accumulate_many_(xs, *[list(s) for s in zip(*states)], torch.tensor([True], device="cuda"),
                                             c.op_params())
    torch.cuda.synchronize()


# ---------------------------------------------------------------- the monitor on a CUDA model
INT_STATS = ("count", "finite", "nan", "posinf", "neginf", "underflow", "overflow")


def train_cnn(steps, backend="compiled", hooks=True, device="cuda", **attach):
    """The benchmark CNN on the GPU, seeded: (stats or None, parameters after `steps` SGD steps)."""
    import hookstats
    from hookstats.tools import bench
    model, step = bench.make_workload("cnn", device=device)
    ctx = bench.reference_backend() if backend == "reference" else contextlib.nullcontext()
    with ctx:
        mon = hookstats.attach(model, **{"outputs": True, "grads": True, "param_grads": True, **attach}) if hooks else None
        try:
            for _ in range(steps):
                step()
            stats = mon.stats() if mon else None
        finally:
            if mon:
                mon.remove()
    return stats, [p.detach().clone() for p in model.parameters()]


def same_records(a, b, what):
    """Integer statistics equal; mean and std within 1e-6 of (|mean| + std)."""
    bad = sorted(set(a) ^ set(b))
    for t in sorted(set(a) & set(b)):
        ra, rb = a[t], b[t]
        keys = INT_STATS + ("hist", "log2_hist")
        if any(not np.array_equal(np.asarray(ra[k]), np.asarray(rb[k])) for k in keys if k in ra):
            bad.append(f"{t} (integer statistics)")
            continue
        scale = abs(rb["mean"]) + rb["std"] + 1e-30
        if abs(ra["mean"] - rb["mean"]) > 1e-6 * scale or abs(ra["std"] - rb["std"]) > 1e-6 * scale:
            bad.append(f"{t} (mean {ra['mean']:.9g} vs {rb['mean']:.9g}, std {ra['std']:.9g} vs {rb['std']:.9g})")
    report(not bad and len(a) > 0, f"{what}: {len(a)} targets" + (f"; differ: {bad[:4]}" if bad else ""))


def check_monitor():
    """attach() on a CUDA model: the CUDA kernel against the reference path on the same training run,
    outputs and gradients passed through bit-exactly, no host sync in the step."""
    import hookstats
    from hookstats.tools import bench
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)
    steps = 4
    kernel, p_kernel = train_cnn(steps)
    ref, p_ref = train_cnn(steps, backend="reference")
    _, p_none = train_cnn(steps, hooks=False)
    same_records(kernel, ref, f"CNN on CUDA, {steps} steps, outputs + grads + param grads: CUDA kernel == reference path")
    report(all(torch.equal(a, b) for a, b in zip(p_kernel, p_none)) and
           all(torch.equal(a, b) for a, b in zip(p_ref, p_none)),
           "parameters after training with hookstats (kernel, reference) == without, bitwise")

    for label, kwargs in (("no hooks", None), ("hookstats", {}), ("hookstats, history + log_every=3", {"history": True, "log_every": 3})):
        model, step = bench.make_workload("cnn", device="cuda")
        mon = hookstats.attach(model, outputs=True, grads=True, param_grads=True, **kwargs) if kwargs is not None else None
        step(); step()
        torch.cuda.synchronize()
        err = None
        torch.cuda.set_sync_debug_mode("error")
        try:
            with bench.SyncCounter() as c:
                for _ in range(6):
                    step()
        except RuntimeError as e:
            err = str(e).splitlines()[0]
        finally:
            torch.cuda.set_sync_debug_mode(0)
            if mon:
                mon.remove()
        report(err is None and c.total == 0, f"{label}: 6 CUDA training steps under torch.cuda.set_sync_debug_mode('error'): "
                                             f"{err or 'no synchronizing call'}; counted {c.counts or 'no sync op'}")

    torch.use_deterministic_algorithms(False)


def check_gpu_tests():
    """The pytest cases that need a GPU (skipped elsewhere): CUDA graphs under torch.compile
    (mode="reduce-overhead") measure what eager measures; model-parallel targets stay on their devices;
    reduce() over NCCL (one rank per GPU, up to 2) equals the oracle."""
    cases = ["tests/test_compile.py::test_cuda_graphs_reduce_overhead_measure_what_eager_measures",
             "tests/test_targets.py::test_model_parallel_keeps_each_target_on_its_own_device",
             "tests/test_distributed.py::test_reduce_of_outputs_and_gradients_over_nccl"]
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *cases], cwd=ROOT,
                       capture_output=True, text=True, timeout=900)
    last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-300:]
    report(r.returncode == 0 and "skipped" not in last, f"GPU-only pytest cases: {last}")


# ---------------------------------------------------------------- bandwidth
def time_ms(fn, iters):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def sweep(cfg, quick):
    """Read bandwidth of the op (both histograms; the float buckets alone, on N(0, 1) and on ReLU-like data
    (half zeros: one shared counter for all of them); no histogram) against a device-to-device copy of the same
    tensor (its read side: bytes / copy time, the yardstick) and x.sum() (one read pass: the floor)."""
    from hookstats import StatsConfig
    bare = StatsConfig(eps=cfg.eps, linear_hist=False, log_hist=False)
    flt = float_only(cfg)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    mbs = [1, 4, 16, 64] if quick else [1, 4, 16, 64, 256, 1024]
    print("\n| dtype | MB | cache | op GB/s | op, FLOAT_HIST alone GB/s | same, ReLU data GB/s | op, no hist GB/s | "
          "copy GB/s (read side) | x.sum() GB/s | op / copy | FLOAT_HIST alone / copy | same, ReLU data / copy | "
          "op / sum | FLOAT_HIST alone / sum | no hist / sum |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for dtype in (torch.float32, torch.bfloat16):
        for mb in mbs:
            n = mb * 2**20 // torch.tensor([], dtype=dtype).element_size()
            for cache in ("cold", "hot") if mb * 2**20 * 2 < l2 else ("cold",):
                nbuf = 1 if cache == "hot" else max(2, -(-4 * l2 // (mb * 2**20)))
                bufs = [torch.randn(n, device="cuda").to(dtype) for _ in range(nbuf)]
                outs = [torch.empty_like(b) for b in bufs]
                state, state2, state3 = new_state(cfg, "cuda"), new_state(bare, "cuda"), new_state(flt, "cuda")
                on = torch.tensor([True], device="cuda")
                k = [0]

                def nxt():
                    k[0] = (k[0] + 1) % nbuf
                    return k[0]

                def op():
                    torch.ops.hookstats.accumulate_(bufs[nxt()], *state, on, cfg.op_params())

                def op_bare():
                    torch.ops.hookstats.accumulate_(bufs[nxt()], *state2, on, bare.op_params())

                def op_float():
                    torch.ops.hookstats.accumulate_(bufs[nxt()], *state3, on, flt.op_params())

                def copy():
                    i = nxt()
                    outs[i].copy_(bufs[i])

                def total():
                    bufs[nxt()].sum()

                iters = max(10, min(2000, 2**30 // (mb * 2**20)))
                t = {name: time_ms(fn, iters) for name, fn in
                     (("op", op), ("float", op_float), ("bare", op_bare), ("copy", copy), ("sum", total))}
                for b in bufs:  # ReLU-like data: the same buffers, their negative half zeroed
                    b.clamp_(min=0)
                t["relu"] = time_ms(op_float, iters)
                gbs = {name: mb * 2**20 / ms / 1e6 for name, ms in t.items()}
                print(f"| {str(dtype)[6:]} | {mb} | {cache} | {gbs['op']:.0f} | {gbs['float']:.0f} | {gbs['relu']:.0f} | "
                      f"{gbs['bare']:.0f} | {gbs['copy']:.0f} | {gbs['sum']:.0f} | {gbs['op'] / gbs['copy']:.2f} | "
                      f"{gbs['float'] / gbs['copy']:.2f} | {gbs['relu'] / gbs['copy']:.2f} | {gbs['op'] / gbs['sum']:.2f} | "
                      f"{gbs['float'] / gbs['sum']:.2f} | {gbs['bare'] / gbs['sum']:.2f} |", flush=True)
                if mb >= 64 and cache == "cold":
                    TARGETS.setdefault(dtype, []).append(gbs['float'] / gbs['copy'])
                del bufs, outs
                torch.cuda.empty_cache()


def graph_latency(cfg, calls=20, dtype=torch.float32, label="both histograms"):
    """us per call, `calls` calls captured in one CUDA graph (and eager), for the op and for x.sum() of the
    same tensor (a one-kernel floor), at 4 KB (the fixed cost) and 1 MB (the < 8 us target)."""
    print(f"\n| {str(dtype)[6:]} tensor, {label} | op in a CUDA graph, us/call | x.sum() in a CUDA graph, us/call | "
          "op eager, us/call |\n|---|---|---|---|")
    for nbytes in (4096, 2**20):
        x = torch.randn(nbytes // torch.tensor([], dtype=dtype).element_size(), device="cuda").to(dtype)
        state, on = new_state(cfg, "cuda"), torch.tensor([True], device="cuda")
        run(x, cfg, state=state, enabled=on)
        out = torch.empty((), device="cuda")
        torch.cuda.synchronize()
        per_call = {}
        for name, fn in (("op", lambda: torch.ops.hookstats.accumulate_(x, *state, on, cfg.op_params())),
                         ("sum", lambda: torch.sum(x, 0, out=out))):
            fn()
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(calls):
                    fn()
            per_call[name] = 1000 * time_ms(graph.replay, 200) / calls
        eager = 1000 * time_ms(lambda: torch.ops.hookstats.accumulate_(x, *state, on, cfg.op_params()), 500)
        size = f"{nbytes // 1024} KB" if nbytes < 2**20 else "1 MB"
        print(f"| {size} | {per_call['op']:.2f} | {per_call['sum']:.2f} | {eager:.2f} |")
    return per_call['op']


def latencies(cfg):
    graph_latency(cfg)
    for dtype in (torch.float32, torch.bfloat16):
        TARGETS[f"graph {dtype}"] = graph_latency(float_only(cfg), dtype=dtype, label="FLOAT_HIST alone")


TARGETS = {}  # FLOAT_HIST alone: {dtype: [op / copy at each size >= 64 MB, cold]}, {"graph dtype": us at 1 MB}


def issue13_targets():
    """The GPU targets on this GPU (performance: printed, not counted as failed checks)."""
    print("\n| target (FLOAT_HIST alone) | measured | met? |\n|---|---|---|")
    for dtype, want in ((torch.bfloat16, 0.75), (torch.float32, 0.90)):
        got = TARGETS.get(dtype, [])
        print(f"| {str(dtype)[6:]} >= {want:.0%} of copy bandwidth at >= 64 MB | "
              f"{', '.join(f'{r:.0%}' for r in got) or 'not run'} | {'yes' if got and min(got) >= want else 'no'} |")
    for dtype in (torch.float32, torch.bfloat16):
        us = TARGETS.get(f"graph {dtype}")
        print(f"| {str(dtype)[6:]}, 1 MB in a CUDA graph < 8 us | {us:.2f} us | {'yes' if us < 8 else 'no'} |")


# ---------------------------------------------------------------- static SASS (no GPU)
def sass_figures(write=None):
    """Instructions on one pass of the hot loop (the one holding LDG.E.128) per element, per kernel (tests/sass.py;
    tests/test_ptxas.py gates them against benchmarks/results/sass_sm90.json, which `write` rewrites), and each
    kernel's float64 divisions outside that loop (test_ptxas: at most 4)."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import sass
    from test_ptxas import FLAGS, KERNELS, TORCH_DEFINES, nvcc
    if sass.cuobjdump() is None:
        sys.exit("cuobjdump not found: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm")
    print("| kernel (sm_90) | loop instructions | per element | ATOMS per element |\n|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        cubin = os.path.join(d, "k.cubin")
        subprocess.run([nvcc(), *FLAGS[:3], *TORCH_DEFINES, "-arch=sm_90", f"-I{os.path.join(ROOT, 'csrc')}", "-cubin", KERNELS,
                        "-o", cubin], check=True)
        text = sass.disassemble(cubin)
        loops, divisions = sass.hot_loops(text), sass.epilogue_divisions(text)
    for name, f in loops.items():
        print(f"| dense {name} | {f['instructions']} | {f['per_element']:.1f} | {f['atoms_per_element']:.1f} |")
    print("\n| kernel (sm_90) | float64 divisions outside the hot loop |\n|---|---|")
    for name, count in divisions.items():
        print(f"| {name} | {count} |")
    if write:
        nv = subprocess.run([nvcc(), "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
        with open(write, "w") as fh:
            json.dump({"nvcc": nv, "command": "python benchmarks/gpu_check.py --sass --write-sass-budget " + write,
                       "per_element": {k: f["per_element"] for k, f in loops.items()}}, fh, indent=1)
            fh.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sass", action="store_true")
    ap.add_argument("--write-sass-budget", metavar="JSON", help="with --sass: write the figures as the gate's budget")
    ap.add_argument("--no-sanitizer", action="store_true", help="skip the compute-sanitizer runs (slow)")
    ap.add_argument("--sweep-only", action="store_true", help="only the bandwidth sweep and the graph latency")
    ap.add_argument("--sanitize-target", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.sass:
        return sass_figures(args.write_sass_budget)
    import hookstats
    from hookstats import StatsConfig

    if not (torch.cuda.is_available() and hookstats.accumulate.has_cuda_kernel()):
        sys.exit("needs a GPU and hookstats built with its CUDA kernel (see .ci/cuda_build.sh)")
    cfg = StatsConfig(nbins=40, lo=-4, hi=12, eps=1e-3)
    if args.sanitize_target:
        return sanitize_target(cfg)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}\n")
    if args.sweep_only:
        sweep(cfg, args.quick)
        latencies(cfg)
        return issue13_targets()
    check_correctness(cfg, args.quick)
    check_float_buckets(cfg, args.quick)
    check_determinism(cfg)
    check_determinism(float_only(cfg))
    check_graph(cfg)
    check_many(cfg)
    check_many(float_only(cfg))
    check_monitor()
    check_gpu_tests()
    if not args.no_sanitizer:
        check_sanitizer()
    sweep(cfg, args.quick)
    latencies(cfg)
    issue13_targets()
    print(f"\n{len(FAILED)} check(s) failed" if FAILED else "\nall checks passed")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
