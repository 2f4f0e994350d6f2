"""Host memory of the per-step history (issue 14 item 9): RSS growth while mon.history() fills up to `keep`
steps with many targets, against what mon.memory() reports. Run it once per checkout to compare them:
PYTHONPATH=<checkout> python benchmarks/history_memory.py [--targets 400 --keep 1000 --steps 1100]"""
import argparse
import gc
import json

import torch
from torch import nn

import hookstats


def rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--targets", type=int, default=400)
    p.add_argument("--keep", type=int, default=1000)
    p.add_argument("--steps", type=int, default=1100)
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(a.targets)])  # one output target each
    mon = hookstats.attach(model, grads=False, history=True, keep=a.keep)
    x = torch.randn(4, 16)
    with torch.no_grad():
        for _ in range(2):
            model(x)
        mon.flush()
        gc.collect()
        before = rss_bytes()
        for _ in range(a.steps):
            model(x)
    mon.flush()
    gc.collect()
    grown = rss_bytes() - before
    mem = mon.memory()
    records = sum(1 for _ in mon._history.memory_sink.items())
    mon.remove()
    print(json.dumps({"hookstats": hookstats.__file__, "targets": a.targets, "keep": a.keep, "steps": a.steps,
                      "kept_records": records, "rss_growth_bytes": grown,
                      "rss_growth_per_record": round(grown / records), "memory": mem}))


if __name__ == "__main__":
    main()
