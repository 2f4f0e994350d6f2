"""The real CUDA kernel source (csrc/cuda/accumulate_kernel.cuh) run on CPU threads through tests/cuda_emu/,
under ThreadSanitizer and under Address/UndefinedBehaviorSanitizer, checked against the CPU kernel
(integer statistics exactly), a float64 NumPy oracle (moments) and, for the float buckets (FLOAT_HIST), the
oracle of each value's bucket from its float64 magnitude (float_oracle.float_buckets); planted bugs must be caught."""
import concurrent.futures
import functools
import glob
import os
import shutil
import subprocess

import numpy as np
import pytest
import torch

from float64_exact import CASES as F64_CASES, assert_moments, case_values
from float_oracle import float_buckets
from conftest import made_once
from helpers import oracle, without_histograms
from test_ptxas import TORCH_DEFINES
from hookstats import layout, rawstate
from hookstats.config import StatsConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EMU = os.path.join(ROOT, "tests", "cuda_emu")
CFG = StatsConfig(nbins=40, lo=-4.0, hi=12.0, eps=1e-3, float_hist=False)
# The slow suites (.ci/run runs them): the emulation builds the kernel source under two sanitizers with the CUDA
# toolkit's headers (minutes of compiling on a 2-core machine), which a newcomer's test command need not wait for.
pytestmark = pytest.mark.slow
SANITIZERS = {
    "tsan": ["-fsanitize=thread"],
    "asan": ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"],
    "bug_nosync": ["-fsanitize=thread", "-DHS_BUG_NO_SYNC", "-DHS_EMU_FLOAT_ONLY"],
    "bug_relaxed": ["-fsanitize=thread", "-DHS_BUG_RELAXED_TICKET", "-DHS_EMU_FLOAT_ONLY"],
    "bug_misaligned": ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-DHS_BUG_IGNORE_ALIGNMENT",
                       "-DHS_EMU_FLOAT_ONLY"],
    "asan_swizzle": ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-DHS_BANK_SWIZZLE=1"],
}
# TSan reports races and exits 66; ASan/UBSan abort. halt_on_error=0: report every race of a run.
ENV = dict(os.environ, TSAN_OPTIONS="halt_on_error=0 exitcode=66 report_signal_unsafe=0",
           ASAN_OPTIONS="detect_leaks=1", UBSAN_OPTIONS="print_stacktrace=1")


def cuda_include():
    """The toolkit's include folder (cuda_fp16.h, libcu++); the nvcc on PATH may be a wrapper script."""
    homes = [os.environ.get("CUDA_HOME", "")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        with open(nvcc, "rb") as f:
            head = f.read(4096).decode(errors="ignore")
        homes += [os.path.dirname(os.path.dirname(w)) for w in head.split() if w.endswith("/bin/nvcc")]
        homes.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    homes += ["/usr/local/cuda"] + sorted(glob.glob("/usr/local/cuda-*"), reverse=True)
    for h in homes:
        if h and os.path.exists(os.path.join(h, "include", "cuda_fp16.h")):
            return os.path.join(h, "include")
    return None


PLANTED_BUGS = ("bug_nosync", "bug_relaxed", "bug_misaligned")
VARIANTS = ("asan_swizzle",)  # the kernel's build-time options other than its defaults


@pytest.fixture(scope="session")
def drivers(tmp_path_factory):
    """The TSan and ASan drivers, built once (once for all xdist workers), side by side."""
    return built(tmp_path_factory, "cuda_emu", [name for name in SANITIZERS if name not in PLANTED_BUGS + VARIANTS])


@pytest.fixture(scope="session")
def bug_drivers(tmp_path_factory):
    """The drivers with a planted bug (the slow suites': three more sanitizer builds, for the checks of the check)."""
    return built(tmp_path_factory, "cuda_emu_bugs", PLANTED_BUGS)


@pytest.fixture(scope="session")
def variant_drivers(tmp_path_factory):
    """The drivers of the kernel's build-time options (the slow suites': HS_BANK_SWIZZLE=1)."""
    return built(tmp_path_factory, "cuda_emu_variants", VARIANTS)


def built(tmp_path_factory, folder, names):
    """{name: path} of the emulation driver built once per sanitizer setup in `names`, the builds side by side."""
    inc = cuda_include()
    if inc is None:
        if os.environ.get("HOOKSTATS_SKIP_CUDA_EMU") == "1":
            pytest.skip("HOOKSTATS_SKIP_CUDA_EMU=1 and no CUDA toolkit headers")
        pytest.fail("CUDA toolkit headers (cuda_fp16.h) not found: set CUDA_HOME, or HOOKSTATS_SKIP_CUDA_EMU=1")
    cxx = os.environ.get("CXX", "g++")
    # torch's -D flags too (no implicit half/bfloat16 conversions): the kernel source must build as the extension does
    base = [cxx, "-std=c++20", "-O1", "-g", "-pthread", *TORCH_DEFINES, f"-I{inc}", f"-I{os.path.join(inc, 'cccl')}",
            f"-I{os.path.join(ROOT, 'csrc')}", os.path.join(EMU, "emu_driver.cpp")]

    def build(out, name):
        r = subprocess.run(base + SANITIZERS[name] + ["-o", str(out / name)], capture_output=True, text=True)
        assert r.returncode == 0, f"building the {name} emulation driver failed:\n{r.stderr[-4000:]}"

    def build_all(out):
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            list(pool.map(functools.partial(build, out), names))

    out = made_once(tmp_path_factory, folder, build_all)
    return {name: str(out / name) for name in names}


def adversarial(n, dtype, seed):
    """N(3, 2) with zeros, tiny and subnormal values, exact bin edges, outliers, NaN and +-Inf."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64) * 2 + 3
    x[::97] = 0.0
    x[1::101] = 1e-7
    x[2::103] = -1e-40 if dtype in (torch.float32, torch.float64) else -1e-6
    edges = torch.tensor(CFG.edges())
    x[3::89] = edges[torch.randint(len(edges), (len(x[3::89]),), generator=g)]
    x[4::211] = 3e4
    x[5::499] = float("nan")
    x[6::503] = float("inf")
    x[7::509] = -float("inf")
    if dtype == torch.float64:
        x[8::307] = -1e150  # beyond float32: binned as -FLT_MAX; its square still fits float64
    if dtype != torch.float16:
        x[9::401] = 1e30  # its fp32 square overflows: the chunk is redone in fp64
    return x.to(dtype)


# kind: {dtype: (scale, offset)}, float32 where a dtype is not listed (float16 never underflows in fp32).
VANISHING = {"tiny": {torch.float16: (1e-6, 0.0), torch.float64: (1e-150, 0.0), None: (1e-25, 0.0)},
             "subnormal": {torch.float16: (1e-6, 0.0), torch.float64: (1e-150, 0.0), None: (1e-40, 0.0)},
             "offset": {torch.float16: (1e-5, 1e-3), torch.float64: (1e-150, 1e-143), torch.bfloat16: (1e-22, 1e-20),
                        None: (1e-24, 1e-20)}}


def vanishing(n, dtype, seed, kind="tiny"):
    """Values whose fp32 squares underflow: offset + scale N(0, 1), every 16th deviation 30x larger, a run of
    the offset alone (chunks of equal values, not redone) and a NaN."""
    g = torch.Generator().manual_seed(seed)
    scale, offset = VANISHING[kind].get(dtype, VANISHING[kind][None])
    d = torch.randn(n, generator=g, dtype=torch.float64) * scale
    d[::16] *= 30
    d[n // 3:n // 3 + min(n // 4, 300)] = 0.0
    x = offset + d
    x[n // 2 + 5::997] = float("nan")
    return x.to(dtype)


def run_driver(exe, x, mode_args, cfg=CFG, threads=64, launches="2", tmp=None):
    """Runs the emulated kernel; returns [(fstate, istate, ticket)] per target and the completed process."""
    src, dst = tmp / "in.bin", tmp / "out.bin"
    src.write_bytes(x.contiguous().view(torch.uint8).numpy().tobytes())
    args = [exe, str(src), str(dst), str(x.dtype).split(".")[1], str(cfg.nbins), repr(cfg.lo32), repr(cfg.inv_w),
            repr(cfg.eps32), str(cfg.flags), str(threads), launches] + [str(a) for a in mode_args]
    r = subprocess.run(args, capture_output=True, text=True, env=ENV, timeout=300)
    states = []
    if r.returncode == 0:
        raw = np.fromfile(dst, dtype=np.uint8)
        per = 8 * (layout.FSTATE_SIZE + cfg.istate_size + 1)
        for k in range(len(raw) // per):
            rec = raw[k * per:(k + 1) * per]
            f = rec[:40].view(np.float64)
            i = rec[40:40 + 8 * cfg.istate_size].view(np.int64)
            states.append((f, i, int(rec[-8:].view(np.int64)[0])))
    return states, r


def cpu_state(x, launches, cfg=CFG):
    f, i = rawstate.empty(cfg.istate_size)
    for _ in range(launches):
        torch.ops.hookstats.accumulate_(x, f, i, torch.empty(0, dtype=torch.uint8), torch.tensor([True]),
                                        cfg.op_params())
    return f.numpy(), i.numpy()


def check(state, x, launches, cfg=CFG):
    """Integers equal the CPU kernel's; moments match the float64 oracle; the ticket is re-armed."""
    f, i, ticket = state
    cf, ci = cpu_state(x, launches, cfg)
    bad = np.nonzero(i != ci)[0]
    assert bad.size == 0, f"istate slots {bad[:10].tolist()} differ: emulated {i[bad[:10]]} vs CPU {ci[bad[:10]]}"
    assert ticket == 0, f"ticket not re-armed: {ticket}"
    of, _ = oracle(x, cfg)
    assert f[layout.N_FINITE] == launches * of[layout.N_FINITE] == cf[layout.N_FINITE]
    assert np.array_equal(f[[layout.MIN, layout.MAX]], cf[[layout.MIN, layout.MAX]], equal_nan=True)
    if of[layout.N_FINITE]:
        std = np.sqrt(of[layout.M2] / of[layout.N_FINITE])
        assert abs(f[layout.MEAN] - of[layout.MEAN]) <= 1e-7 * (abs(of[layout.MEAN]) + std), (f, of)
        assert abs(f[layout.M2] - launches * of[layout.M2]) <= 1e-6 * launches * of[layout.M2], (f, of)


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
# (dtype, grid, misalign in elements, n): every dtype, grids 1..8, aligned/misaligned, tails
DENSE = [(torch.float32, 1, 0, 10007), (torch.float32, 3, 1, 10007), (torch.float32, 8, 3, 9001),
         (torch.float64, 2, 1, 8193), (torch.float64, 5, 0, 10007), (torch.float16, 4, 3, 10007),
         (torch.float16, 7, 0, 6007), (torch.bfloat16, 6, 1, 10007), (torch.bfloat16, 8, 5, 8191)]


@pytest.mark.parametrize("dtype,grid,misalign,n", DENSE, ids=lambda v: str(v).replace("torch.", ""))
def test_dense_tsan(drivers, tmp_path, dtype, grid, misalign, n):
    x = adversarial(n, dtype, seed=grid)
    states, r = run_driver(drivers["tsan"], x, ["dense", misalign, grid], tmp=tmp_path)
    assert r.returncode == 0, r.stderr[-6000:]
    check(states[0], x, launches=2)


@pytest.mark.parametrize("dtype,grid,misalign,n,kind", [(*c, list(VANISHING)[k % 3]) for k, c in enumerate(DENSE)],
                         ids=lambda v: str(v).replace("torch.", ""))
def test_vanishing_values_asan(drivers, tmp_path, dtype, grid, misalign, n, kind):
    """Chunks whose fp32 squares underflow are redone in fp64; chunks of equal values are not (both exact)."""
    x = vanishing(n, dtype, seed=grid, kind=kind)
    states, r = run_driver(drivers["asan"], x, ["dense", misalign, grid], tmp=tmp_path)
    assert r.returncode == 0, r.stderr[-6000:]
    check(states[0], x, launches=2)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n,misalign", [(1, 1), (7, 3), (33, 1), (1000, 2), (4099, 1)])
def test_tails_and_misalignment_asan(drivers, tmp_path, dtype, n, misalign):
    x = adversarial(n, dtype, seed=n)
    states, r = run_driver(drivers["asan"], x, ["dense", misalign, 3], tmp=tmp_path)
    assert r.returncode == 0, r.stderr[-6000:]
    check(states[0], x, launches=2)


@pytest.mark.parametrize("cfg", [StatsConfig(linear_hist=False, float_hist=False),
                                 StatsConfig(nbins=256, lo=0, hi=10, log_hist=False, near_zero="le", float_hist=False),
                                 StatsConfig(linear_hist=False, log_hist=False, float_hist=False)], ids=["log", "lin256", "none"])
def test_histogram_flags(drivers, tmp_path, cfg):
    x = adversarial(5003, torch.float32, seed=7)
    states, r = run_driver(drivers["tsan"], x, ["dense", 1, 3], cfg=cfg, tmp=tmp_path)
    assert r.returncode == 0, r.stderr[-6000:]
    check(states[0], x, launches=2, cfg=cfg)


@pytest.mark.parametrize("san", ["tsan", "asan"])
def test_multi_tensor_launch(drivers, tmp_path, san):
    sizes, grids = [3001, 1, 257, 4096, 17], [2, 1, 1, 4, 1]
    x = adversarial(sum(sizes), torch.bfloat16, seed=3)
    states, r = run_driver(drivers[san], x, ["many", ",".join(map(str, sizes)), ",".join(map(str, grids))],
                           tmp=tmp_path)
    assert r.returncode == 0, r.stderr[-6000:]
    assert len(states) == len(sizes)
    for st, part in zip(states, torch.split(x, sizes)):
        check(st, part, launches=2)


def views(base):
    """Non-dense views of a contiguous 1-D base: (name, view) with the view's storage offset into base."""
    b4 = base[:3 * 10 * 11 * 13].view(3, 10, 11, 13)
    return [("transposed_slice", base.as_strided((23, 31), (1, 70), 2)),
            ("sliced_4d", b4[:, 2:9, ::2, 1:12]),
            ("broadcast", base[:400].view(1, 20, 20).expand(3, 20, 20))]


@pytest.mark.parametrize("san,dtype,which", [("tsan", torch.float32, 0), ("asan", torch.float16, 1),
                                             ("asan", torch.float64, 2), ("tsan", torch.bfloat16, 1)])
@pytest.mark.parametrize("data", ["adversarial", "vanishing"])
def test_strided_view(drivers, tmp_path, san, dtype, which, data):
    base = adversarial(60 * 75, dtype, seed=5) if data == "adversarial" else vanishing(60 * 75, dtype, seed=5)
    name, view = views(base)[which]
    assert not view.is_contiguous(), name
    off = view.storage_offset()
    args = ["strided", 3, ",".join(map(str, view.shape)), ",".join(map(str, view.stride()))]
    states, r = run_driver(drivers[san], base[off:], args, tmp=tmp_path)
    assert r.returncode == 0, r.stderr[-6000:]
    check(states[0], view, launches=2)


def test_disabled_launches_change_nothing(drivers, tmp_path):
    x = adversarial(3000, torch.float32, seed=11)
    states, r = run_driver(drivers["tsan"], x, ["dense", 0, 3], launches="2:3", tmp=tmp_path)
    assert r.returncode == 0, r.stderr[-6000:]
    check(states[0], x, launches=2)


def test_bitwise_identical_runs(drivers, tmp_path):
    """Thread interleavings differ between runs; the fixed merge order makes the state identical."""
    x = adversarial(10007, torch.float32, seed=2)
    a, ra = run_driver(drivers["tsan"], x, ["dense", 1, 5], tmp=tmp_path)
    b, rb = run_driver(drivers["tsan"], x, ["dense", 1, 5], tmp=tmp_path)
    assert ra.returncode == 0 and rb.returncode == 0, ra.stderr[-3000:] + rb.stderr[-3000:]
    assert a[0][0].tobytes() == b[0][0].tobytes() and np.array_equal(a[0][1], b[0][1])


@pytest.mark.slow  # three more sanitizer builds, each a check of the check
@pytest.mark.parametrize("bug", ["bug_nosync", "bug_relaxed"])
def test_planted_bug_is_caught(bug_drivers, tmp_path, bug):
    """A missing __syncthreads after zeroing shared memory, or a relaxed ticket, must fail the run."""
    x = adversarial(10007, torch.float32, seed=1)
    _, r = run_driver(bug_drivers[bug], x, ["dense", 0, 4], tmp=tmp_path)
    assert r.returncode != 0 and "WARNING: ThreadSanitizer: data race" in r.stderr, \
        f"the planted bug {bug} went unnoticed (rc={r.returncode})"


@pytest.mark.slow  # see test_planted_bug_is_caught
def test_planted_misaligned_load_is_caught(bug_drivers, tmp_path):
    """16-byte loads from a pointer that is not 16-byte aligned fault on a GPU; UBSan must flag them."""
    x = adversarial(1000, torch.float32, seed=1)
    _, r = run_driver(bug_drivers["bug_misaligned"], x, ["dense", 1, 2], tmp=tmp_path)
    assert r.returncode != 0 and "misaligned address" in r.stderr, f"misaligned loads went unnoticed (rc={r.returncode})"


# ---------------------------------------------------------------- float64 over its whole range
# (case, sanitizer, mode): dense (misaligned, 3 blocks) and a strided view; moments against the exact oracle
F64_RUNS = [(case, "tsan" if k % 2 else "asan", "strided" if k % 3 == 2 else "dense")
            for k, case in enumerate(F64_CASES)]


@pytest.mark.parametrize("case,san,mode", F64_RUNS, ids=lambda v: str(v))
def test_float64_whole_range(drivers, tmp_path, case, san, mode):
    """Huge values (squares past DBL_MAX), near-DBL_MAX means of both signs, subnormals: each thread's sums stay
    finite (a thread that sees |v| >= 2^480 sums scaled values), M2 past DBL_MAX reads inf, never 0 or NaN;
    integers as the CPU kernel's; 2 launches (a merge across calls)."""
    v = case_values(case)
    x = torch.from_numpy(v)
    if mode == "dense":
        args, seen = ["dense", 1, 3], x
    else:
        base = torch.from_numpy(np.repeat(v, 2))
        seen = base[1::2]
        args, x = ["strided", 3, str(len(v)), "2"], base[1:]
    states, r = run_driver(drivers[san], x, args, tmp=tmp_path)
    assert r.returncode == 0, r.stderr[-6000:]
    f, i, ticket = states[0]
    assert ticket == 0
    assert np.array_equal(i, cpu_state(seen, 2)[1])
    assert_moments(f.tolist(), v.tolist() * 2)


# ---------------------------------------------------------------- float buckets (FLOAT_HIST)
class FloatCfg:
    """A StatsConfig with FLOAT_HIST added to its flags (the rest of the state as the base config's)."""

    def __init__(self, base):
        self.base = base

    def __getattr__(self, name):
        return getattr(self.base, name)

    @property
    def flags(self):
        return self.base.flags | layout.FLOAT_HIST

    @property
    def istate_size(self):
        return layout.istate_size(self.nbins, self.flags)

    def op_params(self):
        return layout.op_params(*self.base.op_params()[:-1], self.flags)


@functools.cache
def cpu_has_float_hist():
    """Whether the CPU kernel takes FLOAT_HIST yet (then the whole emulated istate must equal the CPU one's)."""
    cfg = FloatCfg(CFG)
    try:
        cpu_state(torch.zeros(3), 1, cfg)
    except RuntimeError:
        return False
    return True


def check_float(state, x, launches, cfg):
    """check() on the state before the float buckets; the buckets equal the oracle's (and the CPU kernel's)."""
    f, i, ticket = state
    fb = layout.float_base(cfg.nbins, cfg.flags)
    check((f, i[:fb], ticket), x, launches, cfg.base)
    want = launches * float_buckets(x)
    bad = np.nonzero(i[fb:] != want)[0]
    assert bad.size == 0, f"float slots {bad[:10].tolist()}: emulated {i[fb:][bad[:10]]} vs oracle {want[bad[:10]]}"
    fin = torch.isfinite(x.double()).sum().item()
    assert i[fb:].sum() == launches * fin == i[layout.COUNT] - i[layout.nonfinite_base(cfg.nbins, cfg.flags):][:3].sum()
    if cpu_has_float_hist():
        assert np.array_equal(i, cpu_state(x, launches, cfg)[1]), "emulated istate differs from the CPU kernel's"


def bucket_values(n, dtype, seed):
    """adversarial() plus what the float buckets must sort: -0, bucket edges and the values just below them,
    each dtype's subnormals, its extremes, float64 values beyond float32's range and just below its edges."""
    x = adversarial(n, dtype, seed).double()
    g = torch.Generator().manual_seed(seed)
    edges = torch.ldexp(1 + torch.randint(8, (64,), generator=g) / 8.0, torch.randint(-20, 20, (64,), generator=g))
    info = torch.finfo(dtype)
    big = 1e100 if dtype == torch.float64 else info.max  # float64: squares that fit (the moments' oracle)
    special = [-0.0, 0.0, big, -big, info.tiny, -info.tiny, info.smallest_normal / 3,
               -info.smallest_normal / 5, info.smallest_normal * 0.99]
    if dtype in (torch.float32, torch.bfloat16):
        special += [1e-39, -2.0 ** -129, 2.0 ** -130, 3e-44]  # float32 subnormals (bf16: some exactly)
    if dtype == torch.float64:
        special += [1e-300, -1e-46, 2.0 ** -149, 2.0 ** -150, 1e38 * 7, -2.0 ** 128, 2.0 ** 128 * (1 - 2 ** -30),
                    float.fromhex("0x1.1ffffffffffffp+0"), -float.fromhex("0x1.fffffffffffffp-127")]
    extra = torch.cat([edges, -edges, torch.nextafter(edges, torch.zeros(())), torch.tensor(special, dtype=torch.float64)])
    pos = torch.randperm(n, generator=g)[:len(extra)]
    x[pos] = extra[:len(pos)]
    return x.to(dtype)


# (dtype, grid, misalign, n, sanitizer)
FLOAT_DENSE = [(torch.float32, 1, 0, 4099, "tsan"), (torch.float32, 5, 1, 10007, "asan"),
               (torch.bfloat16, 3, 1, 10007, "tsan"), (torch.bfloat16, 8, 5, 6007, "asan"),
               (torch.float16, 4, 3, 8191, "tsan"), (torch.float16, 2, 0, 3001, "asan"),
               (torch.float64, 3, 1, 5003, "tsan"), (torch.float64, 2, 0, 4001, "asan")]


@pytest.mark.parametrize("dtype,grid,misalign,n,san", FLOAT_DENSE, ids=lambda v: str(v).replace("torch.", ""))
def test_float_buckets_dense(drivers, tmp_path, dtype, grid, misalign, n, san):
    """FLOAT_HIST alone (the future default): exact buckets on every dtype, multi-block, misaligned, 3 launches."""
    cfg = FloatCfg(StatsConfig(eps=1e-3, linear_hist=False, log_hist=False, float_hist=False))
    x = bucket_values(n, dtype, seed=grid)
    states, r = run_driver(drivers[san], x, ["dense", misalign, grid], cfg=cfg, launches="3", tmp=tmp_path)
    assert r.returncode == 0, r.stderr[-6000:]
    check_float(states[0], x, 3, cfg)


@pytest.mark.parametrize("base", [StatsConfig(nbins=40, lo=-4.0, hi=12.0, eps=1e-3, float_hist=False),
                                  StatsConfig(nbins=256, lo=0, hi=10, log_hist=False, near_zero="le", float_hist=False),
                                  StatsConfig(linear_hist=False, float_hist=False)], ids=["all", "lin256", "log"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_float_buckets_with_other_histograms(drivers, tmp_path, base, dtype):
    cfg = FloatCfg(base)
    x = bucket_values(5003, dtype, seed=7)
    states, r = run_driver(drivers["asan"], x, ["dense", 1, 3], cfg=cfg, tmp=tmp_path)
    assert r.returncode == 0, r.stderr[-6000:]
    check_float(states[0], x, 2, cfg)


@pytest.mark.parametrize("data", ["buckets", "vanishing"])
def test_float_buckets_tails_vanishing(drivers, tmp_path, data):
    """Scalar heads and tails, and chunks redone in fp64 (underflowed squares) keep their buckets."""
    cfg = FloatCfg(CFG)
    for dtype in DTYPES:
        for n in (1, 7, 33, 1000):
            x = bucket_values(n, dtype, seed=n) if data == "buckets" and n > 200 else (
                vanishing(n, dtype, seed=n) if data == "vanishing" else adversarial(n, dtype, seed=n))
            states, r = run_driver(drivers["asan"], x, ["dense", 1, 2], cfg=cfg, tmp=tmp_path)
            assert r.returncode == 0, r.stderr[-6000:]
            check_float(states[0], x, 2, cfg)


@pytest.mark.parametrize("where", ["vectors", "head_and_tail", "zeros_only"])
def test_bf16_zero_buckets_keep_their_tiny_values(drivers, tmp_path, where):
    """bf16 counts +-0 in the buckets of slots 0 and 2048 and moves them to the zero bucket per block; the nonzero
    values below 2^-129 that share those buckets stay there: + and -, in the vectors (found by the running minimum,
    read again), in the scalar head and tail (counted as they go), and ReLU-like data with zeros alone."""
    cfg = FloatCfg(StatsConfig(nbins=40, lo=-4.0, hi=12.0, eps=1e-3, float_hist=False))
    g = torch.Generator().manual_seed(31)
    n, misalign = 5016, 3  # a head of 5 values, 626 vectors, a tail of 3
    x = torch.randn(n, generator=g, dtype=torch.float64)
    x[x < 0.3] = 0.0
    x[1::7] = -0.0
    tiny = torch.tensor([2.0 ** -133, 15 * 2.0 ** -133, 2.0 ** -131, 3 * 2.0 ** -132], dtype=torch.float64)
    if where == "vectors":
        x[200:4000:37] = tiny[torch.arange(len(x[200:4000:37])) % 4] * torch.where(
            torch.arange(len(x[200:4000:37])) % 3 == 0, -1.0, 1.0)
    elif where == "head_and_tail":
        x[[0, 1, n - 1, n - 2]] = torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=torch.float64) * tiny
    x = x.to(torch.bfloat16)
    assert where == "zeros_only" or ((x.view(torch.int16) & 0x7FFF) - 1).clamp(min=-1).lt(15).sum() > 0
    for san in ("asan", "tsan"):
        states, r = run_driver(drivers[san], x, ["dense", misalign, 3], cfg=cfg, tmp=tmp_path)
        assert r.returncode == 0, r.stderr[-6000:]
        check_float(states[0], x, 2, cfg)


@pytest.mark.parametrize("san", ["tsan", "asan"])
def test_float_buckets_multi_tensor_launch(drivers, tmp_path, san):
    cfg = FloatCfg(StatsConfig(eps=1e-3, linear_hist=False, log_hist=False, float_hist=False))
    sizes, grids = [3001, 1, 257, 4096, 17], [2, 1, 1, 4, 1]
    x = bucket_values(sum(sizes), torch.bfloat16, seed=3)
    states, r = run_driver(drivers[san], x, ["many", ",".join(map(str, sizes)), ",".join(map(str, grids))],
                           cfg=cfg, tmp=tmp_path)
    assert r.returncode == 0, r.stderr[-6000:]
    assert len(states) == len(sizes)
    for st, part in zip(states, torch.split(x, sizes)):
        check_float(st, part, 2, cfg)


@pytest.mark.parametrize("san,dtype,which", [("tsan", torch.float32, 0), ("asan", torch.float16, 1),
                                             ("asan", torch.float64, 2), ("tsan", torch.bfloat16, 1)])
def test_float_buckets_strided_view(drivers, tmp_path, san, dtype, which):
    cfg = FloatCfg(StatsConfig(**(dict(nbins=40, lo=-4.0, hi=12.0) if which == 2 else {}), eps=1e-3, linear_hist=which == 2,
                               log_hist=False, float_hist=False))
    base = bucket_values(60 * 75, dtype, seed=5)
    name, view = views(base)[which]
    args = ["strided", 3, ",".join(map(str, view.shape)), ",".join(map(str, view.stride()))]
    states, r = run_driver(drivers[san], base[view.storage_offset():], args, cfg=cfg, tmp=tmp_path)
    assert r.returncode == 0, r.stderr[-6000:]
    check_float(states[0], view, 2, cfg)


def test_float_buckets_disabled_launches_change_nothing(drivers, tmp_path):
    cfg = FloatCfg(StatsConfig(eps=1e-3, linear_hist=False, log_hist=False, float_hist=False))
    x = bucket_values(3000, torch.bfloat16, seed=11)
    states, r = run_driver(drivers["tsan"], x, ["dense", 0, 3], cfg=cfg, launches="2:3", tmp=tmp_path)
    assert r.returncode == 0, r.stderr[-6000:]
    check_float(states[0], x, 2, cfg)


# (dtype, config, mode, sanitizer): launches with enabled=3 (SKIP_HIST) count all but the histograms
SKIP_CASES = [(torch.float32, dict(linear_hist=True), "dense", "tsan"),
              (torch.bfloat16, dict(linear_hist=True, float_hist=False), "strided", "asan"),
              (torch.float64, dict(), "many", "asan"),
              (torch.float16, dict(linear_hist=True, float_hist=False), "dense", "asan")]


@pytest.mark.parametrize("dtype,hists,mode,san", SKIP_CASES, ids=lambda v: str(v).replace("torch.", ""))
def test_launches_without_histograms(drivers, tmp_path, dtype, hists, mode, san):
    """2 launches with enabled=1, 1 with 0, 2 with 3: the histograms hold the first two, the rest every launch
    that ran (NaN/Inf too: they live beside the linear bins)."""
    cfg = StatsConfig(nbins=40, lo=-4.0, hi=12.0, eps=1e-3, **hists)
    x = bucket_values(6007, dtype, seed=13)
    if mode == "dense":
        args, parts = ["dense", 1, 3], [x]
    elif mode == "many":
        sizes = [3001, 1, 3005]
        args, parts = ["many", ",".join(map(str, sizes)), "2,1,3"], list(torch.split(x, sizes))
    else:
        name, view = views(x[:60 * 75])[1]
        args, parts = ["strided", 3, ",".join(map(str, view.shape)), ",".join(map(str, view.stride()))], [view]
        x = x[view.storage_offset():]
    states, r = run_driver(drivers[san], x, args, cfg=cfg, launches="2:1:2", tmp=tmp_path)
    assert r.returncode == 0, r.stderr[-6000:]
    assert len(states) == len(parts)
    for (f, i, ticket), part in zip(states, parts):
        of, oi = oracle(part, cfg)
        want = 2 * oi + 2 * without_histograms(oi, cfg)
        bad = np.nonzero(i != want)[0]
        assert bad.size == 0, f"istate slots {bad[:10].tolist()}: emulated {i[bad[:10]]} vs oracle {want[bad[:10]]}"
        assert ticket == 0
        assert f[layout.N_FINITE] == 4 * of[layout.N_FINITE]
        if of[layout.N_FINITE] > 1:
            std = np.sqrt(of[layout.M2] / of[layout.N_FINITE])
            assert abs(f[layout.MEAN] - of[layout.MEAN]) <= 1e-7 * (abs(of[layout.MEAN]) + std)
            assert abs(f[layout.M2] - 4 * of[layout.M2]) <= 1e-6 * 4 * of[layout.M2]


# ---------------------------------------------------------------- 32-bit block counters
@pytest.mark.parametrize("threads", [64, 512])
def test_block_element_bound_leaves_u32_headroom(drivers, tmp_path, threads):
    """The launcher caps n / blocks at max_block_elems (fewer blocks when the scratch is small). A block's 32-bit
    totals -- its warps' near-zero sum, every shared histogram slot -- must not wrap even when all its values
    land in one counter (all zeros): the bound plus what the grid-stride loops give one block beyond n / blocks
    must leave a quarter of the u32 range spare, for every histogram setting (a block of 2^31 - 1 zeros is fine)."""
    for flags in range(16):
        r = subprocess.run([drivers["tsan"], "-", "-", "float32", "40", "0", "1", "0", str(flags), str(threads), "1",
                            "limits"], capture_output=True, text=True, env=ENV, timeout=60)
        assert r.returncode == 0, r.stderr[-2000:]
        bound = int(r.stdout)
        excess = threads * 16 + 16  # one more 16-byte vector per thread, and the scalar head
        assert bound + excess <= 2**32 - 2**30, f"flags={flags}: a block may see {bound} elements, no u32 headroom"
        assert threads < 512 or bound >= 2**31 - 1, f"flags={flags}: one block (a 1-block scratch) must take 2^31 - 1"
        assert bound // threads + 16 < 2**24, f"flags={flags}: a thread's float near-zero count is not exact"


# ---------------------------------------------------------------- launches on one state from several streams
def test_stream_order_makes_a_state_wait_for_its_previous_stream(tmp_path):
    """csrc/cuda/stream_order.h against a fake CUDA API, under TSan: a launch on a state from another stream waits
    for the state's previous stream (one event per state), inside one capture too; no wait across a capture's
    boundary; nothing on one stream; concurrent threads lose no switch."""
    exe = str(tmp_path / "stream_order_test")
    r = subprocess.run([os.environ.get("CXX", "g++"), "-std=c++20", "-O1", "-g", "-pthread", "-fsanitize=thread",
                        f"-I{os.path.join(ROOT, 'csrc')}", os.path.join(EMU, "stream_order_test.cpp"), "-o", exe],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    r = subprocess.run([exe], capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout[-3000:] + r.stderr[-3000:]


def threshold_values(n, dtype, eps, seed):
    """N(0, 1) with the dtype's values next to eps and -eps (the one at or below it, and the next up), zeros of both
    signs, NaN and +-Inf: the paired near-zero test of 16-bit values (eps rounded down to the dtype) at its edge."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64).to(dtype)
    bits = x.view(torch.int16)
    b = int(torch.tensor([eps], dtype=torch.float64).to(dtype).view(torch.int16)[0])  # nearest to eps
    near = [k for k in (b - 1, b, b + 1, b + 2) if 0 <= k < 0x7c00]
    edge = torch.tensor(near + [k - 0x8000 for k in near] + [0, -0x8000], dtype=torch.int16)
    bits[::3] = edge[torch.randint(len(edge), (len(bits[::3]),), generator=g)]
    x[1::97] = float("nan")
    x[2::101] = float("inf")
    x[3::103] = -float("inf")
    return x


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("near_zero", ["abs", "le"])
@pytest.mark.parametrize("eps", [1e-3, 0.0, 2.0, 3e-6])
def test_paired_near_zero_at_the_threshold(drivers, tmp_path, dtype, near_zero, eps):
    """16-bit values are tested two to a word against eps rounded down to their dtype: the counts equal the float64
    oracle's x <= float32(eps) (or |x| <=) on values at and next to the threshold, and every other statistic the CPU
    kernel's."""
    cfg = StatsConfig(nbins=40, lo=-4.0, hi=12.0, eps=eps, near_zero=near_zero)
    x = threshold_values(4099, dtype, eps, seed=int(eps * 1000) + len(near_zero))
    states, r = run_driver(drivers["asan"], x, ["dense", 1, 3], cfg=cfg, tmp=tmp_path)
    assert r.returncode == 0, r.stderr[-6000:]
    x64 = x.double().numpy()
    a = x64 if near_zero == "le" else np.abs(x64)
    assert states[0][1][1] == 2 * int((a <= np.float32(eps)).sum())
    check(states[0], x, launches=2, cfg=cfg)


def test_chunk_shift_keeps_skewed_chunks_exact(drivers, tmp_path):
    """Chunks shifted by their midrange: a chunk holding one large outlier among small values, and chunks of near-equal
    values one ulp apart (the shift is then one of them), keep the moments within the oracle's bounds."""
    g = torch.Generator().manual_seed(4)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = torch.randn(8192, generator=g, dtype=torch.float64) * 1e-3 + 1.0
        x[::16] = 3e3 if dtype == torch.float16 else 1e6
        x = x.to(dtype)
        x[4096:] = 1.0
        x[4096::7] = torch.nextafter(torch.tensor(1.0, dtype=torch.float32), torch.tensor(2.0)).to(dtype) \
            if dtype == torch.float32 else torch.tensor(1.0078125 if dtype == torch.bfloat16 else 1.0009765625, dtype=dtype)
        states, r = run_driver(drivers["asan"], x, ["dense", 0, 4], tmp=tmp_path)
        assert r.returncode == 0, r.stderr[-6000:]
        check(states[0], x, launches=2)


@pytest.mark.parametrize("pattern", ["one_thread_every_pass", "run_of_rounds", "first_and_last_passes"])
@pytest.mark.parametrize("float_hist", [False, True], ids=["no_float", "float"])
def test_pipelined_loop_redoes_each_rare_pass(drivers, tmp_path, pattern, float_hist):
    """float32's loop issues the next pass's loads before consuming this pass's; a pass with a non-finite value or an
    fp32 overflow leaves it, is read again and redone, and the loop starts over after it. Every pass of one thread
    rare (both buffers, back to back), rare passes over whole rounds of the grid, and each thread's first and last
    whole pass rare: integers as the CPU kernel's, moments as the float64 oracle's."""
    grid, threads, misalign = 2, 64, 1
    n = 16 * 1024 + 3
    g = torch.Generator().manual_seed(21)
    x = torch.randn(n, generator=g, dtype=torch.float64) * 2 + 3
    vec = (torch.arange(n) - misalign) // 4  # the 16-byte vector of each element past the scalar head
    gtid, k = vec % (grid * threads), vec // (grid * threads)  # the reading thread; its pass is k // 2
    body = (vec >= 0) & (vec < (n - misalign) // 4)
    if pattern == "one_thread_every_pass":
        x[body & (gtid == 5) & (torch.arange(n) % 4 == 1)] = float("nan")
        x[body & (gtid == 6) & (torch.arange(n) % 4 == 2)] = 1e30
    elif pattern == "run_of_rounds":
        x[body & (k >= 6) & (k < 14) & (torch.arange(n) % 4 == 3)] = float("inf")
    else:
        last = (k // 2 == (vec.max() // (grid * threads)) // 2 - 1) | (k // 2 == 0)
        x[body & last & (torch.arange(n) % 4 == 0)] = -float("inf")
        x[body & last & (gtid % 3 == 0)] = 1e30
    x = x.to(torch.float32)
    cfg = StatsConfig(nbins=40, lo=-4.0, hi=12.0, eps=1e-3, float_hist=float_hist)
    for san in ("asan", "tsan"):
        states, r = run_driver(drivers[san], x, ["dense", misalign, grid], cfg=cfg, threads=threads, tmp=tmp_path)
        assert r.returncode == 0, r.stderr[-6000:]
        check(states[0], x, launches=2, cfg=cfg)


# ---------------------------------------------------------------- shifted sums merged across warps and blocks
def block_of(n, dtype, grid, threads=64):
    """The block of the dense kernel that reads each of n elements (aligned, n a multiple of the vector width): the
    grid-stride loops hand vector v to thread v % (grid x threads)."""
    vec = torch.arange(n) // (16 // torch.empty(0, dtype=dtype).element_size())
    return (vec // threads) % grid


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("data", ["offset", "block_means", "outlier_shift"])
def test_merged_shifted_sums_keep_offset_data_exact(drivers, tmp_path, dtype, data):
    """Threads, warps and blocks merge shifted sums (no division), converted once: on 1e6 + N(0, 1e-3) the shift
    differences cancel exactly, blocks whose means differ by a few spreads or by 1e6 merge without cancellation,
    and a block whose first chunk (its shift) lies 1e3 spreads away (float64; float32 values of 1e6 are 1/16
    apart) keeps M2 within the oracle's bounds (check: M2 to 1e-6, the mean to 1e-7 of |mean| + std)."""
    grid, n, threads = 5, 20480, 128
    g = torch.Generator().manual_seed(11)
    x = 1e6 + torch.randn(n, generator=g, dtype=torch.float64) * 1e-3
    blk = block_of(n, dtype, grid, threads)
    if data == "block_means":
        x += torch.tensor([0.0, 2e-3, -5e-3, -1.2e6, 3e-3], dtype=torch.float64)[blk]
    elif data == "outlier_shift":
        first = torch.nonzero(blk == 2)[0, 0]
        x[first:first + 8] += 1.0 if dtype == torch.float64 else 64.0
    x = x.to(dtype)
    states, r = run_driver(drivers["asan" if dtype == torch.float64 else "tsan"], x, ["dense", 0, grid],
                           threads=threads, tmp=tmp_path)
    assert r.returncode == 0, r.stderr[-6000:]
    check(states[0], x, launches=2)
