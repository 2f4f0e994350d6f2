"""The hot loop of each dense CUDA kernel read from its sm_90 SASS (cuobjdump): instructions and shared-memory
atomics per element, float64 divisions on it, global-load bytes in flight along it (bytes_in_flight); and the float64
divisions of every kernel outside that loop and outside the out-of-line rare calls (epilogue_divisions).
tests/test_ptxas.py gates them against benchmarks/results/sass_sm90.json; `python benchmarks/gpu_check.py --sass`
prints them."""
import glob
import os
import re
import shutil
import subprocess

import torch

# elements in one 16-byte vector (one LDG.E.128); a pass of the loop reads one per 128-bit load on it
PER_VECTOR = {"f": 4, "13__nv_bfloat16": 8, "6__half": 8, "d": 2}
DTYPE = {"f": "float32", "13__nv_bfloat16": "bfloat16", "6__half": "float16", "d": "float64"}


def cuobjdump():
    """cuobjdump on PATH, beside nvcc, or from the nvidia-cuda-cuobjdump wheel (with nvdisasm beside it)."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    site = os.path.dirname(os.path.dirname(torch.__file__))
    for path in glob.glob(os.path.join(site, "nvidia", "*", "bin", "cuobjdump")):
        return path
    return None


def disassemble(obj):
    """SASS text of an object or cubin (nvdisasm found beside cuobjdump)."""
    tool = cuobjdump()
    env = dict(os.environ, PATH=os.path.dirname(tool) + os.pathsep + os.environ.get("PATH", ""))
    return subprocess.run([tool, "-sass", obj], capture_output=True, text=True, check=True, env=env).stdout


def hot_loops(sass):
    """{"dtype lin=L log=G float=F": {"instructions", "per_element", "atoms_per_element", "fp64_divisions", "path"}} of every
    dense kernel's hot loop (loop_bounds); its elements are those of the 128-bit loads on its path (the software-pipelined
    float32 loop: both of its buffers' passes)."""
    out = {}
    for body in re.split(r"\n\s*Function : ", sass)[1:]:
        m = re.match(r"_ZN9hookstats11cuda_kernel12dense_kernelI(\w+?)Lb(\d)ELb(\d)ELb(\d)E", body.split()[0])
        if not m:
            continue
        path = hot_path(body)
        elems = PER_VECTOR[m.group(1)] * sum("LDG.E.128" in t for t in path)
        out[f"{DTYPE[m.group(1)]} lin={m.group(2)} log={m.group(3)} float={m.group(4)}"] = {
            "instructions": len(path), "per_element": round(len(path) / elems, 2),
            "atoms_per_element": round(sum("ATOMS" in t for t in path) / elems, 2),
            # a float64 division or square root starts with its reciprocal estimate (the CALLs on the path are the
            # rare redo of a block whose sums overflowed, branched around on every ordinary pass)
            "fp64_divisions": [t for t in path if "MUFU.RCP64H" in t or "MUFU.RSQ64H" in t], "path": path}
    return out


def loop_bounds(ins):
    """(first, last) address of the hot loop (last: its branch back): of the innermost loops holding a 128-bit load,
    the one holding the most (the main loop, not the one-vector remainder after it), the first on a tie."""
    loads = [a for a, t in ins if "LDG.E.128" in t]
    loops = [(int(m.group(1), 16), a) for a, t in ins
             for m in [re.search(r"BRA (?:!?U?P\d, )?0x([0-9a-f]+)", t)] if m and int(m.group(1), 16) <= a]
    holding = [ab for ab in loops if any(ab[0] <= x <= ab[1] for x in loads)]
    inner = [ab for ab in holding if not any(cd != ab and ab[0] <= cd[0] and cd[1] <= ab[1] for cd in holding)]
    return max(inner, key=lambda ab: (sum(ab[0] <= x <= ab[1] for x in loads), -ab[0]))


def hot_path(body):
    """One pass of the innermost loop around the first 128-bit load, following unconditional branches and
    falling through conditional ones (the loop is branch-free but unswitched on the near-zero mode), except a
    forward conditional branch over a CALL: that is the rare redo of a chunk (slow_chunk), and the pass takes the
    jump past it."""
    ins = instructions(body)
    at = {a: k for k, (a, _) in enumerate(ins)}
    lo, hi = loop_bounds(ins)
    k, path = at[lo], []
    while True:
        a, t = ins[k]
        if not t.startswith(("NOP", "BSSY", "BSYNC")):
            path.append(t)
        if a == hi:
            return path
        m = re.match(r"BRA 0x([0-9a-f]+)", t)
        cond = re.match(r"@!?U?P\d BRA (?:!?U?P\d, )?0x([0-9a-f]+)", t)
        if m:
            k = at[int(m.group(1), 16)]
        elif cond and a < int(cond.group(1), 16) <= hi and any(
                u.startswith("CALL") for _, u in ins[k + 1:at[int(cond.group(1), 16)]]):
            k = at[int(cond.group(1), 16)]
        else:
            k += 1


def kernels(sass):
    """{(kind, dtype, label): function body} of every dense and strided kernel; label "lin=L log=G float=F" for the
    dense ones, "" for the strided ones."""
    out = {}
    for body in re.split(r"\n\s*Function : ", sass)[1:]:
        name = body.split()[0]
        m = re.match(r"_ZN9hookstats11cuda_kernel12dense_kernelI(\w+?)Lb(\d)ELb(\d)ELb(\d)E", name)
        if m:
            out[("dense", DTYPE[m.group(1)], f"lin={m.group(2)} log={m.group(3)} float={m.group(4)}")] = body
            continue
        m = re.match(r"_ZN9hookstats11cuda_kernel14strided_kernelI(\w+?)EE", name)
        if m:
            out[("strided", DTYPE[m.group(1)], "")] = body
    return out


def instructions(body):
    return [(int(a, 16), t.strip()) for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", body)]


def inline_code(ins):
    """Addresses of the instructions a kernel runs itself: reached from its entry along every branch, stepping over
    each CALL (the callee -- slow_chunk, the overflow fallbacks, a division's slow path -- is out of line)."""
    at = {a: k for k, (a, _) in enumerate(ins)}
    seen, todo = set(), [0]
    while todo:
        k = todo.pop()
        while k < len(ins) and ins[k][0] not in seen:
            a, t = ins[k]
            seen.add(a)
            predicated = t.startswith("@")
            op = re.sub(r"^@!?U?P\w+\s+", "", t)
            m = re.match(r"BRA(?:\.\w+)*\s+(?:[!\w]+, )?0x([0-9a-f]+)", op)
            if m:
                todo.append(at[int(m.group(1), 16)])
                if not predicated and not op.startswith("BRA.DIV") and "P" not in op.split("0x")[0][3:]:
                    break
            elif op.startswith(("EXIT", "RET")) and not predicated:
                break
            k += 1
    return seen


def epilogue_divisions(sass):
    """{"kind dtype label": float64 divisions (MUFU.RCP64H: a division or square root starts with its reciprocal
    estimate)} of every kernel's inline code outside its hot loop: the thread -> warp -> block -> last block
    reductions."""
    out = {}
    for (kind, dtype, label), body in kernels(sass).items():
        ins = instructions(body)
        inline = inline_code(ins)
        if kind == "dense":
            lo, hi = loop_bounds(ins)
            inline = {a for a in inline if not lo <= a <= hi}
        out[f"{kind} {dtype} {label}".strip()] = sum(1 for a, t in ins if a in inline and "MUFU.RCP64H" in t)
    return out


# bytes a global load brings, by its size suffix (none: 32 bits)
LOAD_BYTES = {"128": 16, "64": 8, "U8": 1, "S8": 1, "U16": 2, "S16": 2}


def registers(t):
    """The general registers an instruction names; a 64-bit operand (a D* opcode, .64, F64, WIDE) as its pair."""
    regs = {int(r) for r in re.findall(r"\bR(\d+)\b", t)}
    op = re.sub(r"^@!?U?P\w+\s+", "", t).split()[0] if t.strip() else ""
    if op.startswith("D") or any(k in t for k in (".64", "F64", "WIDE")):
        regs |= {r + 1 for r in regs}
    return regs


def bytes_in_flight(path):
    """Global-load bytes a thread has in flight after each instruction of one pass of the loop, in the steady state
    (the pass run twice, the second one read): a load is in flight from its issue until the first instruction that
    names one of its destination registers (the scoreboard wait), a predicated load counted as issued."""
    pending, out = [], []
    for lap in range(2):
        for t in path:
            named = registers(t)
            pending = [(regs, b) for regs, b in pending if not regs & named]
            m = re.match(r"(?:@!?U?P\d+\s+)?LDG\.E((?:\.\w+)*)\s+R(\d+),", t)
            if m:
                size = next((LOAD_BYTES[x] for x in m.group(1).split(".") if x in LOAD_BYTES), 4)
                first = int(m.group(2))
                pending.append((set(range(first, first + max(1, size // 4))), size))
            if lap:
                out.append(sum(b for _, b in pending))
    return out


def resident_threads(registers_per_thread, smem_bytes, threads=512, blocks_cap=2, regs_per_sm=65536,
                     smem_per_sm=228 * 1024, smem_reserved=1024, max_threads=2048):
    """Threads of one kernel resident on an SM: blocks of `threads`, at most blocks_cap (the persistent grid's blocks
    per SM), as registers (256 per warp granule), shared memory (with the per-block reservation) and threads allow."""
    warp_regs = -(-registers_per_thread * 32 // 256) * 256
    by_regs = (regs_per_sm // warp_regs) // (threads // 32)
    by_smem = smem_per_sm // (smem_bytes + smem_reserved)
    return min(blocks_cap, by_regs, by_smem, max_threads // threads) * threads
