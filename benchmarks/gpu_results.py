"""The tables docs/performance.md shows from a run of benchmarks/gpu_run.sh (standard library only).

    python benchmarks/gpu_results.py OUT/report.json DEST.json --commit C --command CMD [--date D]

DEST holds {"machine", "torch", "commit", "command", "date", "results": {row: {field: value}}}, as every file in
benchmarks/results/: bandwidth rows ("bfloat16 256 MB N(0,1)": x.sum()'s GB/s and each variant's share of it),
latency rows, training-step rows (per model: step ms, overhead, the op's kernel and host time, peak memory, plan()),
the profile and the sanitizers where the run had them.
"""
import argparse
import json


def figures(report, step):
    for s in report["steps"]:
        if s["step"] == step:
            return s.get("figures", {}), s
    return {}, None


def bandwidth_rows(f):
    rows = {}
    for key, gbs in f.items():
        parts = key.split("/")
        if parts[0] != "sum" or len(parts) != 4:
            continue
        _, dtype, size, data = parts
        row = {"sum_gbps": gbs}
        for variant, field in (("float buckets", "buckets"), ("float buckets, skip step", "skip_step"),
                               ("all histograms", "all_hists"), ("none", "none")):
            op = f.get(f"op/{dtype}/{size}/{data}/{variant}")
            if op is not None:
                row[f"{field}_gbps"] = op
                row[f"{field}_vs_sum"] = round(op / gbs, 3)
        rows[f"{dtype} {size.replace('MB', ' MB')} {data}"] = row
    return rows


def latency_rows(f):
    rows = {}
    for key, us in f.items():
        if key.startswith("latency/"):
            _, dtype, size = key.split("/")
            rows[f"{dtype} {size.replace('KB', ' KB')}, per call"] = {"graph_us": us}
    for key in ("many/64x256KB/bf16", "many/64x256KB/bf16/one call each"):
        if key in f:
            rows[key.replace("many/", "").replace("/", " ")] = {"graph_us": f[key]}
    return rows


def train_rows(f):
    models = sorted({k.split("/")[0] for k in f})
    rows = {}
    for m in models:
        g = {k[len(m) + 1:]: v for k, v in f.items() if k.startswith(m + "/")}
        rows[m] = {"model": g.get("model"), "targets": g.get("hookstats targets"),
                   "step_ms": g.get("step ms/none"), "defaults_ms": g.get("step ms/hookstats defaults"),
                   "overhead": g.get("overhead/hookstats defaults"),
                   "detach_cpu_overhead": g.get("overhead/detach-to-CPU"),
                   "op_kernel_ms": g.get("op kernel ms per step"), "op_kernels": g.get("op kernels per step"),
                   "op_host_us_per_call": g.get("op host us per call"),
                   "peak_mb": g.get("peak MB/none"), "peak_mb_defaults": g.get("peak MB/hookstats defaults"),
                   "peak_mb_detach_cpu": g.get("peak MB/detach-to-CPU"),
                   "host_mb_defaults": g.get("host MB added/hookstats defaults"),
                   "host_mb_detach_cpu": g.get("host MB added/detach-to-CPU"),
                   "plan_overhead": g.get("plan/overhead")}
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report")
    ap.add_argument("dest")
    ap.add_argument("--commit", required=True, help="the commit the run measured (the device's copy has no git)")
    ap.add_argument("--command", required=True)
    ap.add_argument("--date", help="default: the report's")
    a = ap.parse_args(argv)
    with open(a.report) as fh:
        report = json.load(fh)
    env, _ = figures(report, "0-env")
    results = {}
    results.update(bandwidth_rows(figures(report, "5-bandwidth")[0]))
    results.update(latency_rows(figures(report, "5-bandwidth")[0]))
    results.update({f"train {k}": v for k, v in train_rows(figures(report, "7-train")[0]).items()})
    ncu, _ = figures(report, "6-ncu")
    names = {"memory throughput, % of peak": "dram_pct", "issue active, %": "issue_active_pct",
             "achieved occupancy, %": "occupancy_pct", "shared-atomic bank conflicts": "bank_conflicts",
             "kernel time": "kernel_ns", "stall 1": "stall_1", "stall 2": "stall_2", "stall 3": "stall_3"}
    for data in ("N(0,1)", "zeros"):
        row = {names[k.split("/", 1)[1]]: v for k, v in ncu.items() if k.startswith(data + "/")
               and k.split("/", 1)[1] in names}
        if row:
            results[f"ncu bf16 256 MB float buckets {data}"] = row
    status = {s["step"]: s.get("status") for s in report["steps"]}
    results["steps"] = status
    out = {"machine": f"{env.get('gpu')} ({env.get('cores')} CPU cores), CUDA events, calls in CUDA graphs",
           "torch": env.get("torch"), "commit": a.commit, "command": a.command,
           "date": a.date or report.get("written"), "results": results}
    with open(a.dest, "w") as fh:
        json.dump(out, fh, indent=1)
        fh.write("\n")


if __name__ == "__main__":
    main()
