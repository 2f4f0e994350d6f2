"""ptxas gates on the CUDA kernels: every instantiation compiles for sm_80 and sm_90 with zero spills and
zero local memory (-warn-spills,-warn-lmem-usage made fatal by -Werror), each dense kernel's hot loop stays within
its SASS budget, and every kernel's reductions divide at most 4 times in float64 (tests/sass.py). `python tests/test_ptxas.py` prints the register / shared-memory table
(.ci/cuda_build.sh does)."""
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNELS = os.path.join(ROOT, "csrc", "cuda", "accumulate_launch.cu")
ARCHS = ("sm_80", "sm_90")
# nvcc flags of the real build (setup.py nvcc_flags, and the -D flags torch's cpp_extension adds to every CUDA
# extension: no implicit half/bfloat16 conversions or operators) plus the gates
TORCH_DEFINES = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__", "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
                 "-D__CUDA_NO_HALF2_OPERATORS__"]
FLAGS = ["-O3", "-std=c++20", "--expt-relaxed-constexpr", *TORCH_DEFINES, "-Xptxas",
         "-v,-warn-spills,-warn-lmem-usage,-Werror"]


def nvcc():
    found = os.environ.get("CUDA_HOME") and os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc")
    return found if found and os.path.exists(found) else shutil.which("nvcc")


def compile_arch(arch, out_dir):
    """(returncode, ptxas log) of compiling the kernels' translation unit for one architecture."""
    cmd = [nvcc(), *FLAGS, f"-arch={arch}", f"-I{os.path.join(ROOT, 'csrc')}", "-c", KERNELS,
           "-o", os.path.join(out_dir, f"accumulate_launch_{arch}.o")]
    r = subprocess.run(cmd, capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def parse(log):
    """{kernel name: {"registers", "smem", "stack", "spill_stores", "spill_loads"}} from a ptxas -v log, each
    kernel's stack/spill line from its own "Function properties" block (the functions it calls have theirs, which
    come after it), and {callee name: {"stack", "spill_stores", "spill_loads"}} of the non-entry functions."""
    kernels, callees, entry, props = {}, {}, None, None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            entry = m.group(1)
            kernels[demangle(entry)] = {}
            continue
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            props = m.group(1)
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and props:
            figures = dict(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
            if props == entry:
                kernels[demangle(entry)].update(figures)
            else:
                callees[demangle(props)] = figures
            props = None
            continue
        m = re.search(r"Used (\d+) registers.*?(\d+) bytes smem", line)
        if m and entry:
            kernels[demangle(entry)].update(registers=int(m.group(1)), smem=int(m.group(2)))
    return kernels, callees


def demangle(sym):
    """dense_kernel<float,1,1> style names (c++filt when present)."""
    cf = shutil.which("c++filt")
    if cf:
        name = subprocess.run([cf, sym], capture_output=True, text=True).stdout.strip()
        name = re.sub(r"hookstats::cuda_kernel::|\(.*$|void ", "", name)
        return name.replace("__nv_bfloat16", "bf16").replace("__half", "f16").replace("true", "1").replace("false", "0")
    return sym


@pytest.fixture(scope="module")
def ptxas_out(tmp_path_factory):
    """The folder of the compiled objects (accumulate_launch_<arch>.o) and their ptxas logs (logs.json)."""
    if nvcc() is None:
        if os.environ.get("HOOKSTATS_SKIP_PTXAS") == "1":
            pytest.skip("HOOKSTATS_SKIP_PTXAS=1 and no nvcc")
        pytest.fail("nvcc not found (set CUDA_HOME or put nvcc on PATH; HOOKSTATS_SKIP_PTXAS=1 to skip)")
    from conftest import made_once  # here: the script (__main__) runs without pytest's conftest

    def compile_all(out):
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            logs = dict(zip(ARCHS, pool.map(lambda a: compile_arch(a, str(out)), ARCHS)))
        (out / "logs.json").write_text(json.dumps(logs))

    return made_once(tmp_path_factory, "ptxas", compile_all)  # once for all xdist workers


@pytest.fixture(scope="module")
def ptxas_logs(ptxas_out):
    return {arch: tuple(log) for arch, log in json.loads((ptxas_out / "logs.json").read_text()).items()}


# The three gates below compile the kernels for both architectures with nvcc (minutes of CPU): the slow suites run
# them (.ci/run), as does `pytest tests/test_ptxas.py`; the parser's own tests stay in the fast suite.
@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_no_spills_no_local_memory(ptxas_logs, arch):
    rc, log = ptxas_logs[arch]
    assert rc == 0, f"ptxas gate failed for {arch}:\n{log[-6000:]}"
    stats, callees = parse(log)
    assert len(stats) == 36, f"expected 32 dense + 4 strided kernels, ptxas saw {sorted(stats)}"
    for name, s in [*stats.items(), *callees.items()]:
        assert s["spill_stores"] == s["spill_loads"] == s["stack"] == 0, (arch, name, s)
    for name, s in stats.items():
        assert s["registers"] <= 64, f"{name} uses {s['registers']} registers: 2 blocks of 512 threads need <= 64"
    print(table(arch, stats))


@pytest.mark.slow
def test_hot_loops_stay_within_their_sass_budget(ptxas_out):
    """Each dense kernel's hot loop on sm_90: instructions per element no more than the budget recorded in
    benchmarks/results/sass_sm90.json (the issue rate bounds bandwidth: a rise is a slower kernel), and no float64
    division on it (a call with a stack frame on the GPU). A kernel made faster lowers its budget: `python benchmarks/gpu_check.py --sass
    --write-sass-budget benchmarks/results/sass_sm90.json`."""
    import sass
    obj = ptxas_out / "accumulate_launch_sm_90.o"
    assert obj.exists(), "the sm_90 build failed: see test_no_spills_no_local_memory"
    if sass.cuobjdump() is None:
        pytest.fail("cuobjdump not found: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm (the test extra does)")
    loops = sass.hot_loops(sass.disassemble(str(obj)))
    with open(os.path.join(ROOT, "benchmarks", "results", "sass_sm90.json")) as fh:
        budget = json.load(fh)["per_element"]
    assert sorted(loops) == sorted(budget), "a dense kernel was added or removed: rewrite the budget"
    over = {k: (f["per_element"], budget[k]) for k, f in loops.items() if f["per_element"] > budget[k] + 0.25}
    assert not over, f"hot loops past their budget (instructions per element, got vs budget): {over}"
    divisions = {k: f["fp64_divisions"] for k, f in loops.items() if f["fp64_divisions"]}
    assert not divisions, f"float64 divisions in a hot loop: {divisions}"


# Little's law for the H200 (4.8 TB/s over 132 SMs at ~0.8 us of loaded latency: ~29 KB an SM): a float32 pass keeps
# at least this much in flight per SM at every instruction of its hot loop, or bandwidth drops while a chunk is consumed.
MIN_BYTES_IN_FLIGHT_PER_SM = 32 * 1024
# shared memory per block beside the kernel's static part, bounded: the float buckets (16 KB) and a 256-bin linear
# and the log2 histogram per warp (33 KB in all) stay below it
HIST_SMEM_BOUND = 64 * 1024
SMEM_PER_SM = {"sm_80": 164 * 1024, "sm_90": 228 * 1024}


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_float32_hot_loops_keep_32_kb_per_sm_in_flight(ptxas_out, ptxas_logs, arch):
    """Each float32 dense kernel: global-load bytes in flight at every instruction of its hot loop (tests/sass.py
    bytes_in_flight: from a load's issue to the first instruction naming its registers) times the threads an SM holds
    (ptxas's registers and shared memory, the persistent grid's 2 blocks of 512) at least 32 KB: the next pass's
    loads are issued before this pass's values are consumed."""
    import sass
    rc, log = ptxas_logs[arch]
    assert rc == 0, f"ptxas gate failed for {arch}:\n{log[-6000:]}"
    if sass.cuobjdump() is None:
        pytest.fail("cuobjdump not found: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm (the test extra does)")
    stats, _ = parse(log)
    loops = sass.hot_loops(sass.disassemble(str(ptxas_out / f"accumulate_launch_{arch}.o")))
    figures = {}
    for lin in (0, 1):
        for lg in (0, 1):
            for flt in (0, 1):
                name = f"float32 lin={lin} log={lg} float={flt}"
                k = stats[demangle(f"_ZN9hookstats11cuda_kernel12dense_kernelIfLb{lin}ELb{lg}ELb{flt}EEEvNS0_5BatchENS_6"
                                   f"ParamsEPKhi")]
                threads = sass.resident_threads(k["registers"], k["smem"] + HIST_SMEM_BOUND,
                                                smem_per_sm=SMEM_PER_SM[arch])
                per_thread = min(sass.bytes_in_flight(loops[name]["path"]))
                figures[name] = (k["registers"], threads, per_thread, threads * per_thread)
    short = {n: f for n, f in figures.items() if f[3] < MIN_BYTES_IN_FLIGHT_PER_SM}
    assert not short, f"{arch}: (registers, threads per SM, least bytes in flight per thread, per SM): {short}"


def test_bytes_in_flight_drop_when_a_pass_consumes_before_it_loads():
    """A loop that loads, then consumes, has nothing in flight at its end; one that issues the next pass's loads first
    keeps them in flight throughout (the pass is run twice: the loads at its end are in flight at its start)."""
    import sass
    plain = ["LDG.E.128.CONSTANT R4, desc[UR4][R2.64]", "FADD R20, R4, R20", "FADD R20, R7, R20",
             "IADD3 R2, P0, R2, 0x10, RZ", "@P1 BRA 0x10"]
    assert sass.bytes_in_flight(plain) == [16, 0, 0, 0, 0]
    piped = ["@!P2 LDG.E.128.CONSTANT R8, desc[UR4][R2.64]", "FADD R20, R4, R20", "FADD R20, R7, R20",
             "LDG.E.128.CONSTANT R4, desc[UR4][R12.64]", "FADD R20, R8, R20", "IMAD.WIDE.U32 R2, R21, 0x10, R2",
             "@P1 BRA 0x10"]
    assert sass.bytes_in_flight(piped) == [32, 16, 16, 32, 16, 16, 16]
    assert sass.resident_threads(64, 20000) == 1024 and sass.resident_threads(72, 20000) == 512


@pytest.mark.slow
def test_reductions_divide_at_most_four_times(ptxas_out):
    """Every kernel (dense and strided) on sm_90: float64 divisions (MUFU.RCP64H) in its own code outside the hot loop
    -- the thread -> warp -> block -> last block reductions and the merge into fstate -- at most 4 (merged as
    shifted sums, converted once); the out-of-line overflow redo (a CALL) may divide as it needs."""
    import sass
    obj = ptxas_out / "accumulate_launch_sm_90.o"
    assert obj.exists(), "the sm_90 build failed: see test_no_spills_no_local_memory"
    if sass.cuobjdump() is None:
        pytest.fail("cuobjdump not found: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm (the test extra does)")
    counts = sass.epilogue_divisions(sass.disassemble(str(obj)))
    assert len(counts) == 36, f"expected 32 dense + 4 strided kernels, the SASS has {sorted(counts)}"
    over = {k: c for k, c in counts.items() if c > 4}
    assert not over, f"float64 divisions outside the hot loop (at most 4): {over}"


def test_inline_code_steps_over_calls():
    """inline_code follows both ways of a conditional branch and an unconditional jump, stops at EXIT, and does not
    enter a CALL's target (the division in the callee is not counted; the one after the loop is)."""
    import sass
    body = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0020*/                   IADD3 R2, R2, 0x10, RZ ;
        /*0030*/               @P0 BRA 0x10 ;
        /*0040*/               @P1 BRA 0x70 ;
        /*0050*/                   MUFU.RCP64H R9, R7 ;
        /*0060*/                   CALL.REL.NOINC 0xa0 ;
        /*0070*/                   BRA 0x90 ;
        /*0080*/                   MUFU.RCP64H R9, R5 ;
        /*0090*/                   EXIT ;
        /*00a0*/                   MUFU.RCP64H R9, R3 ;
        /*00b0*/                   RET.REL.NODEC R20 0x0 ;
    """
    ins = sass.instructions(body)
    assert sorted(sass.inline_code(ins)) == [0x0, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x90]
    assert sass.loop_bounds(ins) == (0x10, 0x30)
    sass_text = "\n\tFunction : _ZN9hookstats11cuda_kernel14strided_kernelIfEEvNS0_6TargetE\n" + body
    assert sass.epilogue_divisions(sass_text) == {"strided float32": 1}


def test_hot_path_follows_the_loop_and_counts_its_atomics():
    """hot_path on a hand-written loop: the branch back bounds it, an unconditional jump is followed."""
    import sass
    body = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0020*/                   ATOMS.ADD RZ, [R8], R9 ;
        /*0030*/                   BRA 0x50 ;
        /*0040*/                   FADD R1, R1, R1 ;
        /*0050*/                   IADD3 R2, R2, 0x10, RZ ;
        /*0060*/               @P0 BRA 0x10 ;
        /*0070*/                   EXIT ;
    """
    assert sass.hot_path(body) == ["LDG.E.128 R4, desc[UR4][R2.64]", "ATOMS.ADD RZ, [R8], R9", "BRA 0x50",
                                   "IADD3 R2, R2, 0x10, RZ", "@P0 BRA 0x10"]


def test_hot_path_jumps_past_the_rare_redo():
    """A forward conditional branch over a CALL (slow_chunk) is taken; one over plain code falls through."""
    import sass
    body = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0020*/               @P1 BRA 0x40 ;
        /*0030*/                   FADD R5, R5, R5 ;
        /*0040*/               @P0 BRA P2, 0x80 ;
        /*0050*/                   MOV R6, 0x70 ;
        /*0060*/                   CALL.REL.NOINC 0x200 ;
        /*0070*/                   DADD R8, R8, R6 ;
        /*0080*/                   IADD3 R2, R2, 0x10, RZ ;
        /*0090*/               @P3 BRA 0x10 ;
        /*00a0*/                   EXIT ;
    """
    assert sass.hot_path(body) == ["LDG.E.128 R4, desc[UR4][R2.64]", "@P1 BRA 0x40", "FADD R5, R5, R5",
                                   "@P0 BRA P2, 0x80", "IADD3 R2, R2, 0x10, RZ", "@P3 BRA 0x10"]


# A kernel with a stack frame of its own that calls a function without one, as ptxas -v prints them.
LOG = """ptxas info    : Compiling entry function '_Z6kernelPf' for 'sm_90'
ptxas info    : Function properties for _Z6kernelPf
    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 720 bytes smem
ptxas info    : Compile time = 10.0 ms
ptxas info    : Function properties for _Z6calleef
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function '_Z5otherPf' for 'sm_90'
ptxas info    : Function properties for _Z5otherPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 1 barriers, 0 bytes smem
"""


def test_parse_reads_each_kernels_own_stack_line():
    """The gate must see a kernel's stack frame and spills, not those of the function it calls."""
    kernels, callees = parse(LOG)
    k, o = kernels[demangle("_Z6kernelPf")], kernels[demangle("_Z5otherPf")]
    assert (k["stack"], k["spill_stores"], k["spill_loads"], k["registers"], k["smem"]) == (16, 8, 4, 40, 720)
    assert (o["stack"], o["registers"]) == (0, 32)
    assert callees == {demangle("_Z6calleef"): dict(stack=0, spill_stores=0, spill_loads=0)}


def table(arch, stats):
    rows = [f"{arch}: {'kernel':<34} regs  smem  stack  spills"]
    for name, s in sorted(stats.items()):
        rows.append(f"{arch}: {name:<34} {s['registers']:>4} {s['smem']:>5} {s['stack']:>6} "
                    f"{s['spill_stores'] + s['spill_loads']:>7}")
    return "\n".join(rows)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        bad = 0
        for arch in ARCHS:
            rc, log = compile_arch(arch, d)
            if rc:
                print(log[-6000:])
                bad = 1
            print(table(arch, parse(log)[0]))
    sys.exit(bad)
