"""Charts of benchmarks/results/*.json (matplotlib, PNG beside RESULTS.md): op throughput by size,
step-time ratios, RSS growth with steps, and overhead against the number of hooked layers."""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def op_throughput(data, path):
    rows = data["rows"]
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    fig, axes = plt.subplots(1, len(dtypes), figsize=(6.5 * len(dtypes), 4.5), squeeze=False)
    for ax, dt in zip(axes[0], dtypes):
        sub = [r for r in rows if r["dtype"] == dt]
        for name in dict.fromkeys(r["variant"] for r in sub):
            pts = sorted((r["bytes"], r["gbps"], r["gbps_min"], r["gbps_max"]) for r in sub if r["variant"] == name)
            x = [p[0] / 2**20 for p in pts]
            ax.plot(x, [p[1] for p in pts], marker="o", lw=2.5 if name.startswith("op") else 1.2, label=name)
            ax.fill_between(x, [p[2] for p in pts], [p[3] for p in pts], alpha=0.15)
        ax.set(xscale="log", yscale="log", xlabel="tensor size (MB)", ylabel="GB/s (input bytes / time)",
               title=f"{dt}, torch threads={data.get('threads', '?')}: median, band = min..max")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def step_ratios(data, path):
    wl = data["overhead"]
    fig, axes = plt.subplots(1, len(wl), figsize=(6.5 * len(wl), 4.5), squeeze=False)
    for ax, (w, rows) in zip(axes[0], wl.items()):
        names = list(rows)
        r = [rows[n]["ratio"] for n in names]
        err = [[v - rows[n]["ratio_min"] for v, n in zip(r, names)], [rows[n]["ratio_max"] - v for v, n in zip(r, names)]]
        colors = ["tab:green" if n.startswith("hookstats") and "reference" not in n else "tab:gray" for n in names]
        ax.barh(names, r, xerr=err, color=colors)
        ax.axvline(1.0, color="k", lw=0.8)
        ax.axvline(1.05, color="tab:green", lw=0.8, ls="--")
        ax.invert_yaxis()
        ax.set(xlabel="step time / no-hook step time (median of per-repeat ratios, bars: min..max)", title=w)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def memory_growth(data, path):
    wl = data["overhead"]
    fig, axes = plt.subplots(1, len(wl), figsize=(6.5 * len(wl), 4.5), squeeze=False)
    for ax, (w, rows) in zip(axes[0], wl.items()):
        for n, r in rows.items():
            m = r["memory"]
            steps = [0] + sorted(int(k) for k in m["rss"])
            rss = [m["rss_start"]] + [m["rss"][str(k)] if str(k) in m["rss"] else m["rss"][k] for k in steps[1:]]
            ax.plot(steps, [(v - m["rss_start"]) / 2**20 for v in rss], marker="o", label=n)
        ax.set(xlabel="training steps after warm-up", ylabel="RSS growth (MB)", title=w)
        ax.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def layer_scaling(data, path):
    layers = data["layers"]
    counts = sorted(layers, key=int)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for n in layers[counts[0]]:
        if n == "no hooks":
            continue
        ax.plot([int(c) for c in counts], [layers[c][n]["ratio"] for c in counts], marker="o", label=n)
    ax.set(xscale="log", xlabel="hooked Linear(32, 32) layers (batch 16)", ylabel="step time / no hooks",
           title="overhead as the number of hooked layers grows")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--results", default=os.path.join(HERE, "results"))
    p.add_argument("--out", default=HERE)
    a = p.parse_args(argv)
    made = []
    op = os.path.join(a.results, "op_throughput.json")
    if os.path.exists(op):
        with open(op) as f:
            op_throughput(json.load(f), os.path.join(a.out, "op_throughput.png"))
        made.append("op_throughput.png")
    st = os.path.join(a.results, "step_overhead.json")
    if os.path.exists(st):
        with open(st) as f:
            data = json.load(f)
        if "overhead" in data:
            step_ratios(data, os.path.join(a.out, "step_overhead.png"))
            memory_growth(data, os.path.join(a.out, "memory_growth.png"))
            made += ["step_overhead.png", "memory_growth.png"]
        if "layers" in data:
            layer_scaling(data, os.path.join(a.out, "layer_scaling.png"))
            made.append("layer_scaling.png")
    print("wrote " + ", ".join(made) if made else "no results to chart")


if __name__ == "__main__":
    main()
