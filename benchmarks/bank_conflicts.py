"""Shared-memory bank conflicts of the CUDA kernel's float buckets, simulated on the host (tests/bank_conflicts.py):
the average degree (wavefronts per warp instruction of the float-bucket increments) per data distribution and dtype,
under the buckets' own order (main, the kernel's default: the bank is 2 exponent + 3 mantissa bits; the 16-bit
kernels' zeros in their natural slot: fp16, and bf16 on sm_90) and the swizzled table of -DHS_BANK_SWIZZLE=1; and, as a reference for what any mapping could do, the best assignment of buckets to banks found by a greedy search with
re-placement passes (unrestricted: a table lookup, not something the kernel could afford), fitted on one sample and
measured on another. Then replicated tables (not in the kernel: whether copies could reach 2-way): 2 and 4 copies, a
lane's copy chosen by its lane bits and each copy's banks rotated (its own base) or XORed by an offset, the lane bits,
offsets and placement fitted on one sample and measured on another (copiesR, copiesR_layout); the searched assignment
with those copies (copiesR_searched: a bank per copy and bucket); copies confined to 32/R banks each
(confinedR, beyond any base + slot layout); and the distinct words a warp instruction touches with 1, 2 and 4 copies
(wordsR); and main_uncombined: the degree if lanes on one word were not combined (lanes in the
busiest bank), which a GPU's conflict count tells apart. Writes benchmarks/results/bank_conflicts.json.
    PYTHONPATH=. python benchmarks/bank_conflicts.py"""
import itertools
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
import bank_conflicts as bc  # noqa: E402

import results_file  # noqa: E402

N = 1 << 17  # values per sample (the test's samples: seed 0)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


FIT = 1 << 15  # values of the sample the replicated layouts' lane bits and offsets are fitted on
COPIES = (2, 4)
CONFINED = (4, 8, 16)


def searched_banks(slots, passes=3, keys=bc.SLOTS):
    """A bank per slot (array of `keys`: bc.SLOTS, or copies x bc.SLOTS for copy * bc.SLOTS + slot) that keeps the
    average degree of the rows of `slots` low: slots placed from the most frequent on, each in the bank that raises
    the rows' degrees least, then re-placed `passes` times."""
    rows = np.repeat(np.arange(slots.shape[0]), bc.WARP)
    pairs = np.unique(rows * keys + slots.ravel())  # (row, slot) once each: same-slot lanes combine
    prow, pslot = pairs // keys, pairs % keys
    by_slot = {s: prow[pslot == s] for s in np.unique(pslot)}
    order = sorted(by_slot, key=lambda s: -len(by_slot[s]))
    cnt = np.zeros((slots.shape[0], bc.BANKS), dtype=np.int64)
    bank = np.arange(keys) % bc.BANKS

    def place(s):
        r = by_slot[s]
        c = cnt[r]
        cost = np.maximum(c + 1 - c.max(axis=1, keepdims=True), 0).sum(axis=0)
        bank[s] = int(np.argmin(cost))
        cnt[r, bank[s]] += 1

    for s in order:
        place(s)
    for _ in range(passes):
        for s in order:
            cnt[by_slot[s], bank[s]] -= 1
            place(s)
    return bank


def as_words(slots, bank):
    """Distinct words for distinct slots, in the banks `bank` gives them."""
    return slots * bc.BANKS + bank[slots]


def mean_degree(words):
    return float(bc.degrees(words).mean())


def fitted_copies(fit, copies):
    """(degree, lane_bits, offsets, kind) of the replicated layout that keeps the average degree of `fit` (slots of
    lane-ordered instructions) lowest: every choice of lane bits, both placements; offsets: every one for 2 copies,
    for 4 a coordinate search (each copy's offset over 0..31 in turn, twice, from 0, 8, 16, 24)."""
    best = None
    for bits in itertools.combinations(range(5), copies.bit_length() - 1):
        for kind in ("base", "xor"):
            offsets = [bc.BANKS * c // copies for c in range(copies)]
            for _ in range(1 if copies == 2 else 2):
                for c in range(1, copies):
                    trials = []
                    for o in range(bc.BANKS):
                        offsets[c] = o
                        trials.append(mean_degree(bc.words_replicated(fit, bits, offsets, kind)))
                    offsets[c] = int(np.argmin(trials))
            got = (mean_degree(bc.words_replicated(fit, bits, offsets, kind)), bits, list(offsets), kind)
            if best is None or got[0] < best[0]:
                best = got
    return best


def distinct_words(words):
    """Distinct words per instruction, averaged."""
    w = np.sort(words, axis=1)
    return float((1 + (w[:, 1:] != w[:, :-1]).sum(axis=1)).mean())


def replicated(row, fit_slots, fresh_slots):
    row["words1"] = round(distinct_words(fresh_slots), 1)
    for copies in COPIES:
        _, bits, offsets, kind = fitted_copies(fit_slots[: FIT // bc.WARP], copies)
        words = bc.words_replicated(fresh_slots, bits, offsets, kind)
        row[f"copies{copies}"] = round(mean_degree(words), 3)
        row[f"copies{copies}_layout"] = f"lane bits {list(bits)}, {kind} offsets {offsets}"
        row[f"words{copies}"] = round(distinct_words(words), 1)
        keys = bc.lane_copies(bits)[None, :] * bc.SLOTS
        bank = searched_banks(keys + fit_slots, keys=copies * bc.SLOTS)
        row[f"copies{copies}_searched"] = round(mean_degree(as_words(keys + fresh_slots, bank)), 3)
    for copies in CONFINED:
        row[f"confined{copies}"] = round(mean_degree(bc.words_bank_confined(fresh_slots, copies)), 3)


def main():
    results = {}
    for dist in bc.DISTRIBUTIONS:
        x, fresh = bc.sample(dist, N, seed=0), bc.sample(dist, N, seed=1)
        for tag, dtype in DTYPES.items():
            # the buckets' order (the kernel's default) and the swizzle option
            row = {"main": round(bc.average_degree(x, dtype, "main"), 3),
                   "swizzled": round(bc.average_degree(x, dtype, "swizzled"), 3)}
            nat = bc.zeros_natural(dtype)
            row["main_uncombined"] = round(float(bc.uncombined_degrees(
                bc.word_main(bc.slots(bc.warp_instructions(x, dtype), nat))).mean()), 3)
            fit = bc.slots(bc.warp_instructions(x, dtype), nat)
            bank = searched_banks(fit)
            row["searched_in_sample"] = round(float(bc.degrees(as_words(fit, bank)).mean()), 3)
            row["searched_fresh_sample"] = round(
                float(bc.degrees(as_words(bc.slots(bc.warp_instructions(fresh, dtype), nat), bank)).mean()), 3)
            replicated(row, fit, bc.slots(bc.warp_instructions(fresh, dtype), nat))
            results[f"{dist}, {tag}"] = row
            print(f"{dist:18s} {tag}", row, flush=True)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "bank_conflicts.json")
    results_file.write(path, results, f"host simulation ({results_file.cpu_name()}); {N} values per sample, seeds 0 "
                       "(figures, search fit; the replicated layouts fitted on its first "
                       f"{FIT}) and 1 (fresh sample: searched, copies, confined, words); degree = distinct words in the "
                       "busiest of 32 banks")
    print("wrote", path)


if __name__ == "__main__":
    main()
