"""Training-step benchmarks: overhead, host syncs and memory of hookstats against fastai, detach-to-CPU and
wandb.watch-style hooks on a small CNN and transformer; scaling with the number of hooked layers; torch.compile
with and without hookstats. Writes benchmarks/results/step_overhead.json, one row per workload and variant."""
import argparse
import os
import time

import results_file
import torch

from hookstats.tools import bench

LAYER_COUNTS = [8, 32, 128, 512]
SCALING_VARIANTS = ["no hooks", "hookstats", "hookstats (reference op)", "fastai ActivationStats"]


def overhead(workloads, variants, repeats, steps, memory_steps, log, out, save):
    for w in workloads:
        t0 = time.time()
        times = bench.interleaved_step_times(w, variants, repeats=repeats, steps=steps)
        rows = {v: bench.summarize(times[v], times["no hooks"]) for v in variants}
        for v in variants:
            rows[v]["syncs_per_step"], rows[v]["sync_ops"] = bench.count_syncs(w, v)
            checkpoints = sorted({max(1, memory_steps // 4), memory_steps // 2, memory_steps})
            rows[v]["memory"] = bench.measure_memory(w, v, memory_steps, checkpoints)
        out[w] = rows
        save()
        log(f"{w}: {time.time() - t0:.0f} s")
        log(bench.table({"machine": bench.machine(), "workloads": {w: rows}}))
    return out


def layer_scaling(counts, variants, repeats, steps, log):
    variants = [v for v in SCALING_VARIANTS if v in variants]
    out = {}
    for n in counts:
        times = bench.interleaved_step_times(f"stack{n}", variants, repeats=repeats, steps=steps)
        out[n] = {v: bench.summarize(times[v], times["no hooks"]) for v in variants}
        for v in variants:  # added time per hooked layer per step, from medians of the same run
            out[n][v]["us_per_layer"] = (out[n][v]["median_ms"] - out[n]["no hooks"]["median_ms"]) * 1e3 / n
        log(f"stack{n}: " + ", ".join(f"{v} {r['ratio']:.2f}x" for v, r in out[n].items()))
    return out


def compiled(workload, repeats, steps, log):
    """torch.compile'd training step, without and with hookstats (attached before compiling)."""
    import torch._dynamo

    import hookstats
    res = {}
    runs = {}
    for name in ("compiled, no hooks", "compiled, hookstats"):
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        model, _ = bench.make_workload(workload)
        mon = hookstats.attach(model, **bench.hookstats_kwargs()) if name.endswith("hookstats") else None
        step = compiled_step(workload, torch.compile(model), model)
        t0 = time.perf_counter()
        step()
        step()
        res[name] = {"compile_s": time.perf_counter() - t0,
                     "graph_breaks": sum(torch._dynamo.utils.counters["graph_break"].values())}
        runs[name] = (step, mon)
    samples = {n: [] for n in runs}
    names = list(runs)
    for r in range(repeats):
        for n in names[r % 2:] + names[: r % 2]:
            samples[n].append(bench.time_steps(runs[n][0], lambda: None, steps))
    for n in names:
        res[n].update(bench.summarize(samples[n], samples["compiled, no hooks"]))
    mon = runs["compiled, hookstats"][1]
    res["hookstats_measured_targets"] = sum(1 for r in mon.stats().values() if r["count"] > 0)
    mon.remove()
    log("compile: " + ", ".join(f"{n} {res[n]['median_ms']:.1f} ms" for n in names))
    return res


def compiled_step(workload, cmodel, model):
    import torch.nn.functional as F
    torch.manual_seed(0)
    if workload == "cnn":
        x, y = torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,))
    else:
        x, y = torch.randint(0, 1000, (16, 128)), torch.randint(0, 1000, (16 * 128,))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def step():
        out = cmodel(x)
        F.cross_entropy(out.reshape(-1, out.shape[-1]), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workloads", default="cnn,transformer")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=10, help="timed steps per variant per repeat")
    p.add_argument("--memory-steps", type=int, default=40)
    p.add_argument("--layers", default=",".join(map(str, LAYER_COUNTS)))
    p.add_argument("--skip", default="", help="comma list of parts to skip: overhead, layers, compile")
    p.add_argument("--json", default="benchmarks/results/step_overhead.json")
    p.add_argument("--variants", default=None,
                   help="comma list of variant names (" + ", ".join(v.name for v in bench.VARIANT_LIST) + "); default all")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, = cores)")
    p.add_argument("--clock", default="wall", choices=list(bench.CLOCKS),
                   help="cpu: the thread's CPU time, for a loaded shared machine (needs --threads 1)")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    bench.set_clock(a.clock)
    skip = set(filter(None, a.skip.split(",")))
    available = bench.available_variants()
    names = ["none", *a.variants.split(",")] if a.variants else [v.name for v in bench.VARIANT_LIST]
    variants = [bench.LABELS[n] for n in names if bench.LABELS[n] in available]
    log = lambda s: print(s, flush=True)  # noqa: E731
    load = os.getloadavg()[0]
    res = {}
    clock = "the thread's CPU clock" if a.clock == "cpu" else "wall clock"

    def save():
        results_file.write(a.json, rows(res), results_file.machine(clock, load_start=load), argv)
    if "overhead" not in skip:
        overhead(a.workloads.split(","), variants, a.repeats, a.steps, a.memory_steps, log,
                 res.setdefault("overhead", {}), save)
    if "layers" not in skip:
        res["layers"] = layer_scaling([int(n) for n in a.layers.split(",")], variants, a.repeats, a.steps * 2, log)
        save()
    if "compile" not in skip:
        try:
            res["compile"] = compiled("cnn", a.repeats, a.steps, log)
        except Exception as e:  # recorded, not hidden: the table says what failed
            res["compile"] = {"error": {"error": f"{type(e).__name__}: {e}"[:2000]}}
            log(f"compile failed: {res['compile']['error']}")
    save()
    return res


def rows(res):
    """{"cnn: hookstats": {field: value}, "stack32: hookstats": ..., "compile: compiled, hookstats": ...}."""
    out = {}
    timing = ("median_ms", "ratio", "ratio_q1", "ratio_q3", "ratio_min", "ratio_max", "repeats")
    for w, variants in res.get("overhead", {}).items():
        for v, r in variants.items():
            m = r["memory"]
            last = max(m["rss"])
            out[f"{w}: {v}"] = {**{k: r[k] for k in timing}, "syncs_per_step": r["syncs_per_step"],
                                "peak_rss_mb": m["peak_rss"] / 1e6,
                                "rss_growth_mb_per_step": (m["rss"][last] - m["rss_start"]) / 1e6 / last,
                                "monitor_bytes": m["monitor_bytes"]}
    for n, variants in res.get("layers", {}).items():
        for v, r in variants.items():
            out[f"stack{n}: {v}"] = {**{k: r[k] for k in timing}, "us_per_layer": r["us_per_layer"]}
    for name, r in res.get("compile", {}).items():
        if isinstance(r, dict):
            out[f"compile: {name}"] = r
    return out


if __name__ == "__main__":
    main()
