"""Shared-memory bank conflicts of the CUDA kernel's float buckets, simulated on the host (tests/bank_conflicts.py):
the average degree (wavefronts per warp instruction of the float-bucket increments) per data distribution and dtype,
under the buckets' own order (main, the kernel's default: the bank is 2 exponent + 3 mantissa bits; the 16-bit
kernels' zeros in their natural slot: fp16, and bf16 on sm_90) and the swizzled table of -DHS_BANK_SWIZZLE=1; and, as a reference for what any mapping could do, the best assignment of buckets to banks found by a greedy search with
re-placement passes (unrestricted: a table lookup, not something the kernel could afford), fitted on one sample and
measured on another. Writes benchmarks/results/bank_conflicts.json.
    PYTHONPATH=. python benchmarks/bank_conflicts.py"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
import bank_conflicts as bc  # noqa: E402

import results_file  # noqa: E402

N = 1 << 17  # values per sample (the test's samples: seed 0)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def searched_banks(slots, passes=3):
    """A bank per slot (array of bc.SLOTS) that keeps the average degree of the rows of `slots` low: slots placed
    from the most frequent on, each in the bank that raises the rows' degrees least, then re-placed `passes` times."""
    rows = np.repeat(np.arange(slots.shape[0]), bc.WARP)
    pairs = np.unique(rows * bc.SLOTS + slots.ravel())  # (row, slot) once each: same-slot lanes combine
    prow, pslot = pairs // bc.SLOTS, pairs % bc.SLOTS
    by_slot = {s: prow[pslot == s] for s in np.unique(pslot)}
    order = sorted(by_slot, key=lambda s: -len(by_slot[s]))
    cnt = np.zeros((slots.shape[0], bc.BANKS), dtype=np.int64)
    bank = np.arange(bc.SLOTS) % bc.BANKS

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


def main():
    results = {}
    for dist in bc.DISTRIBUTIONS:
        x, fresh = bc.sample(dist, N, seed=0), bc.sample(dist, N, seed=1)
        for tag, dtype in DTYPES.items():
            # the buckets' order (the kernel's default) and the swizzle option
            row = {"main": round(bc.average_degree(x, dtype, "main"), 3),
                   "swizzled": round(bc.average_degree(x, dtype, "swizzled"), 3)}
            nat = bc.zeros_natural(dtype)
            fit = bc.slots(bc.warp_instructions(x, dtype), nat)
            bank = searched_banks(fit)
            row["searched_in_sample"] = round(float(bc.degrees(as_words(fit, bank)).mean()), 3)
            row["searched_fresh_sample"] = round(
                float(bc.degrees(as_words(bc.slots(bc.warp_instructions(fresh, dtype), nat), bank)).mean()), 3)
            results[f"{dist}, {tag}"] = row
            print(f"{dist:18s} {tag}", row, flush=True)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "bank_conflicts.json")
    results_file.write(path, results, f"host simulation ({results_file.cpu_name()}); {N} values per sample, seeds 0 "
                       "(figures, search fit) and 1 (fresh sample); degree = distinct words in the busiest of 32 banks")
    print("wrote", path)


if __name__ == "__main__":
    main()
