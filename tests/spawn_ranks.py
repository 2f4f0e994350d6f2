"""Runs a worker in N spawned gloo processes for the multi-process tests of parallel training, and reads back
what each rank saved (rank<r>.pt in the output folder)."""
import os
import socket
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from helpers import exit_without_finalizing

SPAWN_TIMEOUT_S = 300


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(fn, world, out):
    """fn(rank, world) in `world` processes of one gloo process group; its result is what the rank saved."""
    ctx = mp.start_processes(_worker, args=(fn, world, free_port(), str(out)), nprocs=world, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + SPAWN_TIMEOUT_S
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"{world} gloo processes did not finish within {SPAWN_TIMEOUT_S} s")
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]


def _worker(rank, fn, world, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    try:
        torch.save(fn(rank, world), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
    exit_without_finalizing()
