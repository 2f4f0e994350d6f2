"""Markdown tables of benchmarks/results/*.json, as pasted into RESULTS.md (step time ratios, host syncs,
memory, layer scaling, torch.compile, and the op alone)."""
import json
import os
import sys

import op_throughput

HERE = os.path.dirname(os.path.abspath(__file__))


def mb(b):
    return f"{b / 2**20:.1f}"


def steps_tables(data):
    out = []
    for w, rows in data.get("overhead", {}).items():
        out.append(f"\n**{w}** (ms/step median [min..max]; ratio = median of per-repeat ratios to no hooks)\n")
        out.append("| variant | ms/step | ratio [min..max] | host syncs/step | peak RSS MB | RSS growth MB "
                   "(steps: MB) | monitor bytes |")
        out.append("|---|---|---|---|---|---|---|")
        for v, r in rows.items():
            m = r["memory"]
            growth = ", ".join(f"{k}: {mb(m['rss'][k] - m['rss_start'])}" for k in sorted(m["rss"], key=int))
            syncs = f"{r['syncs_per_step']:.0f}" + (f" ({', '.join(f'{k} {c:.0f}' for k, c in r['sync_ops'].items())})"
                                                   if r["sync_ops"] else "")
            mon = "-" if m.get("monitor_bytes") is None else f"{m['monitor_bytes']}"
            out.append(f"| {v} | {r['median_ms']:.1f} [{r['min_ms']:.1f}..{r['max_ms']:.1f}] | {r['ratio']:.3f} "
                       f"[{r['ratio_min']:.3f}..{r['ratio_max']:.3f}] | {syncs} | {mb(m['peak_rss'])} | {growth} | {mon} |")
    if "layers" in data:
        layers = data["layers"]
        counts = sorted(layers, key=int)
        names = [n for n in layers[counts[0]] if n != "no hooks"]
        out.append("\n**Layer scaling** (Linear(32, 32) + ReLU stacks, batch 16; ratio to no hooks, "
                   "and added µs per hooked layer per step)\n")
        out.append("| layers | no hooks ms/step | " + " | ".join(names) + " |")
        out.append("|---|---|" + "---|" * len(names))
        for c in counts:
            cells = [f"{layers[c][n]['ratio']:.2f}x, {layers[c][n]['us_per_layer']:.0f} µs" for n in names]
            out.append(f"| {c} | {layers[c]['no hooks']['median_ms']:.1f} | " + " | ".join(cells) + " |")
    if "compile" in data:
        c = data["compile"]
        out.append("\n**torch.compile (CNN)**\n")
        if "error" in c:
            out.append(f"failed: `{c['error']}`")
        else:
            out.append("| variant | ms/step [min..max] | ratio | first two steps (compile) s | graph breaks |")
            out.append("|---|---|---|---|---|")
            for n in ("compiled, no hooks", "compiled, hookstats"):
                r = c[n]
                out.append(f"| {n} | {r['median_ms']:.1f} [{r['min_ms']:.1f}..{r['max_ms']:.1f}] | {r['ratio']:.3f} | "
                           f"{r['compile_s']:.1f} | {r['graph_breaks']} |")
            out.append(f"\nhookstats targets with data after the compiled run: {c['hookstats_measured_targets']}")
    return "\n".join(out)


def main():
    res = os.path.join(HERE, "results")
    for name, fn in (("step_overhead.json", steps_tables), ("op_throughput.json", None)):
        path = os.path.join(res, name)
        if not os.path.exists(path):
            print(f"({name} missing)", file=sys.stderr)
            continue
        with open(path) as f:
            data = json.load(f)
        print(fn(data) if fn else op_throughput.markdown(data["rows"]))


if __name__ == "__main__":
    main()
