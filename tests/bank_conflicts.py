"""Shared-memory bank conflicts of the CUDA kernel's float buckets, simulated on the host.

The dense kernel's hot loop increments one 32-bit counter of the block's shared float table per value
(csrc/cuda/accumulate_kernel.cuh float_offset, ATOMS.POPC.INC). A warp instruction increments value k of each lane's
16-byte vector, and lane l holds the warp's l-th vector of 512 contiguous bytes: value 4l + k of the 128 (fp32), 8l + k
of the 256 (bf16, fp16). Lanes hitting the same word are combined into one access; distinct words in one of the 32
banks are served one after the other, so an instruction takes as many shared-memory wavefronts as its busiest bank
has distinct words: its degree. This module mirrors the kernel's word of a value (tests/test_bank_conflicts.py checks
the mirror against the kernel source through the emulation build) and averages the degree over data;
benchmarks/bank_conflicts.py writes the figures."""
import numpy as np
import torch

BANKS = 32
WARP = 32
SHIFT = 20           # csrc/accumulator.h kFloatShift: slot = float32 bits >> 20 (sign, exponent, 3 mantissa bits)
SLOTS = 4096
ZERO = 2047          # kFloatZero: exact zeros of either sign
SWIZZLE_SHIFT = 7    # accumulate_kernel.cuh kBankSwizzleShift: word = slot ^ (slot >> 7)


def slots(x, zeros_natural=False):
    """The float bucket (csrc/accumulator.h float_slot) of each value of a float32 view of x (bf16 and fp16 values
    are exact in float32): the top 12 bits, zero moved to ZERO; with zeros_natural (the 16-bit kernels' shared table,
    kZerosNatural) +0 and -0 stay in slots 0 and 2048."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    s = (bits >> np.uint32(SHIFT)).astype(np.int64)
    return s if zeros_natural else np.where(bits & np.uint32(0x7FFFFFFF), s, ZERO)


def zeros_natural(dtype):
    """Whether the dense kernel of dtype counts zeros in their natural slot in shared memory (fp16; bf16 on sm_90 and in
    the emulation, which builds as sm_90 does)."""
    return dtype in (torch.float16, torch.bfloat16)


def word_main(slot):
    """The shared word of a slot before the swizzle: the slot itself (bank = 2 exponent + 3 mantissa bits)."""
    return np.asarray(slot)


def word_swizzled(slot):
    """The kernel's word (float_word): the bank bits XORed with the slot's top 5 bits (sign, exponent bits 4-7)."""
    slot = np.asarray(slot)
    return slot ^ (slot >> SWIZZLE_SHIFT)


MAPPINGS = {"main": word_main, "swizzled": word_swizzled}
KERNEL_MAPPING = "main"  # the kernel's default; "swizzled" with -DHS_BANK_SWIZZLE=1 (accumulate_kernel.cuh)


# Replicated tables (not in the kernel: a study of whether copies could bring the degree to 2). `copies` tables, a
# lane's copy chosen by some of its lane bits; copy c starts at word c * (SLOTS + BANKS) + offsets[c] (offsets < BANKS),
# so a thread's counter is its own base (computed once, outside the hot loop) plus its slot: copy c's banks are the
# slots' rotated by offsets[c]. kind "xor" puts slot s of copy c at word c * SLOTS + (s ^ offsets[c]) instead (one
# LOP3 can fold that XOR into the offset's mask). Same bucket in two copies: two words, so those lanes no longer combine.
def lane_copies(lane_bits):
    """The copy (0 .. 2 ** len(lane_bits) - 1) of each of the 32 lanes: its bits lane_bits, the first the lowest."""
    lane = np.arange(WARP)
    return sum((((lane >> b) & 1) << i for i, b in enumerate(lane_bits)), np.zeros(WARP, dtype=np.int64))


def replicated_bytes(copies, kind="base"):
    """Shared memory of `copies` tables (the block's float buckets; the kernel's one table: 16 KiB)."""
    return copies * (SLOTS + (BANKS if kind == "base" else 0)) * 4


def words_replicated(slots, lane_bits, offsets, kind="base"):
    """The words of (instructions, 32) lane-ordered slots under replicated tables: lane l uses copy
    lane_copies(lane_bits)[l], placed as `kind` says with offsets[copy]."""
    slots = np.asarray(slots)
    copy = lane_copies(lane_bits)[None, :]
    off = np.asarray(offsets)[copy]
    if kind == "base":
        return copy * (SLOTS + BANKS) + off + slots
    return copy * SLOTS + (slots ^ off)


def words_bank_confined(slots, copies):
    """A reference beyond any base + slot layout: lane l's copy l % copies holds its SLOTS counters in banks
    [c * 32 / copies, (c + 1) * 32 / copies) only (slot s at row s // width, bank c * width + s % width), so lanes of
    different copies never share a bank. copies x 16 KiB."""
    slots = np.asarray(slots)
    width = BANKS // copies
    copy = (np.arange(WARP) % copies)[None, :]
    return (slots // width) * BANKS + copy * width + slots % width


def values_per_vector(dtype):
    return 16 // torch.tensor([], dtype=dtype).element_size()


def warp_instructions(x, dtype):
    """The (instructions, 32) values of the kernel's float-bucket increments over x cast to dtype: each warp reads
    512 contiguous bytes, lane l the l-th 16-byte vector, and instruction k takes value k of every lane's vector.
    Whole warps only (the scalar head and tail take other paths)."""
    v = torch.as_tensor(np.asarray(x, dtype=np.float64)).to(dtype).float().numpy()
    per = values_per_vector(dtype)
    n = len(v) // (WARP * per) * (WARP * per)
    return v[:n].reshape(-1, WARP, per).transpose(0, 2, 1).reshape(-1, WARP)


def degrees(words):
    """Per row of 32 word indices (one warp instruction): the greatest number of distinct words in one bank."""
    w = np.sort(np.asarray(words), axis=1)
    distinct = np.ones(w.shape, dtype=bool)
    distinct[:, 1:] = w[:, 1:] != w[:, :-1]
    rows = np.broadcast_to(np.arange(w.shape[0])[:, None], w.shape)
    per_bank = np.bincount((rows * BANKS + w % BANKS)[distinct], minlength=w.shape[0] * BANKS)
    return per_bank.reshape(-1, BANKS).max(axis=1)


def uncombined_degrees(words):
    """What the degree would be if lanes hitting one word were not combined (the lanes in the busiest bank): the H200's
    conflict count tells the two apart (docs/performance.md)."""
    w = np.asarray(words)
    rows = np.broadcast_to(np.arange(w.shape[0])[:, None], w.shape)
    return np.bincount((rows * BANKS + w % BANKS).ravel(), minlength=w.shape[0] * BANKS).reshape(-1, BANKS).max(axis=1)


def average_degree(x, dtype, mapping=KERNEL_MAPPING, natural=None):
    """Mean degree of the warp instructions that count x's float buckets, under one of MAPPINGS; natural: whether
    zeros stay in their natural slot (default: as the kernel of dtype does)."""
    natural = zeros_natural(dtype) if natural is None else natural
    return float(degrees(MAPPINGS[mapping](slots(warp_instructions(x, dtype), natural))).mean())


def _activations(rng, n, width=768):
    """Real-ish activations: GELU of a transformer MLP's pre-activations, rows of `width` channels whose scales
    (log-normal, four outlier channels 30x) and offsets differ per channel, laid out channel-innermost."""
    ch = np.arange(n) % width
    scale = np.exp(rng.normal(0.0, 0.5, width))
    scale[rng.choice(width, 4, replace=False)] *= 30.0
    z = rng.standard_normal(n) * scale[ch] + rng.normal(0.0, 0.3, width)[ch]
    return 0.5 * z * (1.0 + np.tanh(0.7978845608 * (z + 0.044715 * z ** 3)))


# name: values from a seeded generator
DISTRIBUTIONS = {
    "N(0,1)": lambda rng, n: rng.standard_normal(n),
    "N(0,1e-3)": lambda rng, n: rng.standard_normal(n) * 1e-3,
    "ReLU(N(0,1))": lambda rng, n: np.maximum(rng.standard_normal(n), 0.0),
    "all zero": lambda rng, n: np.zeros(n),
    "constant 0.7": lambda rng, n: np.full(n, 0.7),
    "U(-1,1)": lambda rng, n: rng.uniform(-1.0, 1.0, n),
    "GELU activations": _activations,
}


def sample(name, n, seed=0):
    return DISTRIBUTIONS[name](np.random.default_rng(seed), n)
