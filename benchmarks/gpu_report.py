"""The report of benchmarks/gpu_run.sh (standard library only: it runs with any python3).

    python benchmarks/gpu_report.py record OUT STEP [--status S] [--reason R] [--rc N --wall S --timeout T]
                                              [--figure KEY=VALUE ...]
    python benchmarks/gpu_report.py ncu OUT STEP CSV        figures of an `ncu --csv --page raw` run
    python benchmarks/gpu_report.py write OUT [--command CMD]

record merges into OUT/steps/STEP.json (the Python steps write theirs as they go; the shell adds exit status,
wall time and timeout). write reads every step and writes OUT/report.md and OUT/report.json: each step passed,
failed or skipped (and why), its figures, and the performance targets beside what was measured.
"""
import argparse
import glob
import json
import os
import platform
import re
import subprocess
import sys
import time

TARGETS = (  # (name, how it is read from the figures)
    "bf16 >= 75% of x.sum() bandwidth at >= 256 MB, float buckets",
    "fp32 >= 90% of x.sum() bandwidth at >= 256 MB, float buckets",
    "1 MB call in a CUDA graph <= 8 us",
    "defaults <= 3% of a GPT-2-small bf16 training step",
    "planner within 25% of the measured overhead (GPT-2 small)",
    "every correctness check and invariant holds",
    "sanitizers clean",
)


def step_path(out, step):
    return os.path.join(out, "steps", f"{step}.json")


def load(out, step):
    try:
        with open(step_path(out, step)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"step": step, "checks": [], "figures": {}}


def save(out, step, d):
    os.makedirs(os.path.join(out, "steps"), exist_ok=True)
    tmp = step_path(out, step) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(d, f, indent=1)
    os.replace(tmp, step_path(out, step))


def parse_value(v):
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v


def record(out, step, status=None, reason=None, rc=None, wall=None, timeout=None, figures=()):
    """Merges a step's exit status and figures into its JSON; the status follows from what the step said and
    how it ended: a timeout or a non-zero exit fails a step that said nothing worse."""
    d = load(out, step)
    d.setdefault("checks", [])
    d.setdefault("figures", {})
    for kv in figures:
        k, _, v = kv.partition("=")
        d["figures"][k] = parse_value(v)
    if rc is not None:
        d["rc"], d["wall_s"], d["timeout_s"] = rc, wall, timeout
    if status:
        d["status"] = status
    elif rc is not None:
        said = d.get("status")
        if rc in (124, 137):
            d["status"], reason = "failed", reason or f"timed out after {timeout} s"
        elif rc != 0 and said != "failed":
            d["status"], reason = "failed", reason or f"exit status {rc}"
        elif said in (None, "running"):
            d["status"] = "passed" if rc == 0 else "failed"
    if reason:
        d["reason"] = reason
    save(out, step, d)
    return d


# ---------------------------------------------------------------- ncu
NCU_METRICS = {
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "memory throughput, % of peak",
    "smsp__issue_active.avg.pct_of_peak_sustained_active": "issue active, %",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved occupancy, %",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_atom.sum": "shared-atomic bank conflicts",
    "gpu__time_duration.sum": "kernel time",
}


def ncu_figures(csv_text):
    """{figure: value} from `ncu --csv --page raw` output: one row per profiled kernel (N(0,1), then zeros),
    the metrics above and the three largest warp stall reasons of each."""
    import csv
    lines = [ln for ln in csv_text.splitlines() if ln.startswith('"')]
    rows = list(csv.reader(lines))
    if len(rows) < 2:
        return {}
    head = rows[0]
    data = [r for r in rows[1:] if len(r) == len(head) and r[head.index("Kernel Name")] != ""
            and not r[0].startswith("ID") and any(c.replace(".", "", 1).replace(",", "").isdigit() for c in r)]
    out = {}
    for k, r in enumerate(data):
        label = ("N(0,1)", "zeros")[k] if k < 2 else f"kernel {k}"
        vals = dict(zip(head, r))
        for m, name in NCU_METRICS.items():
            if m in vals:
                out[f"{label}/{name}"] = parse_value(vals[m].replace(",", ""))
        stalls = []
        for m, v in vals.items():
            if re.match(r"smsp__average_warps?_issue_stalled_.*_per_issue_active\.ratio$", m):
                try:
                    stalls.append((float(v.replace(",", "")), m.split("stalled_")[1].split("_per_")[0]))
                except ValueError:
                    pass
        for rank, (v, why) in enumerate(sorted(stalls, reverse=True)[:3]):
            out[f"{label}/stall {rank + 1}"] = f"{why} {v:.2f}"
    return out


# ---------------------------------------------------------------- the report
def machine():
    d = {"host": platform.node(), "python": platform.python_version()}
    try:
        d["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"],
                                  capture_output=True, text=True, timeout=20).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        d["gpu"] = None
    try:
        d["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                                     cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        d["commit"] = None
    return d


def figure(steps, step, key):
    return steps.get(step, {}).get("figures", {}).get(key)


def targets(steps):
    """[(target, measured text, met: True/False/None)] from the steps' figures."""
    rows = []
    bw = steps.get("5-bandwidth", {}).get("figures", {})
    for dtype, want, name in (("bfloat16", 0.75, TARGETS[0]), ("float32", 0.90, TARGETS[1])):
        got = {k.split("/")[2] + " " + k.split("/")[3]: v for k, v in bw.items()
               if k.startswith(f"ratio/{dtype}/") and k.endswith("/float buckets") and k.split("/")[2] in ("256MB", "1024MB")}
        rows.append((name, ", ".join(f"{k}: {v:.0%}" for k, v in got.items()) or "not measured",
                     (min(got.values()) >= want) if got else None))
    lat = {d: bw.get(f"latency/{d}/1024KB") for d in ("bfloat16", "float32")}
    have = {d: v for d, v in lat.items() if v is not None}
    rows.append((TARGETS[2], ", ".join(f"{d}: {v} us" for d, v in have.items()) or "not measured",
                 all(v <= 8 for v in have.values()) if have else None))
    over = figure(steps, "7-train", "gpt2-small/overhead/hookstats defaults")
    rows.append((TARGETS[3], "not measured" if over is None else f"{over:+.1%}", None if over is None else over <= 0.03))
    pred = figure(steps, "7-train", "gpt2-small/plan/overhead")
    if over is None or pred is None:
        rows.append((TARGETS[4], "not measured", None))
    else:
        err = abs(pred - over) / max(abs(over), 1e-9)
        rows.append((TARGETS[4], f"predicted {pred:+.1%}, measured {over:+.1%} ({err:.0%} apart)", err <= 0.25))
    corr = [steps[s] for s in ("2-correctness", "3-graphs") if s in steps]
    bad = sum(1 for s in corr for c in s.get("checks", []) if not c["ok"])
    n = sum(len(s.get("checks", [])) for s in corr)
    done = [s for s in corr if s.get("status") in ("passed", "failed")]
    rows.append((TARGETS[5], f"{n - bad}/{n} checks hold" if n else "not run",
                 None if not done else (bad == 0 and all(s["status"] == "passed" for s in done))))
    san = [steps[s] for s in ("4-memcheck", "4-racecheck") if s in steps]
    # a sanitizer that timed out or crashed said nothing of the kernels: not run, never "not clean"
    ran = [s for s in san if s.get("status") in ("passed", "failed") and "dry run" not in (s.get("reason") or "")
           and s.get("rc") in (0, 3, None)]
    text = "; ".join(f"{s['step']}: {s.get('status')}{' (' + s['reason'] + ')' if s.get('reason') else ''}"
                     for s in san) or "not run"
    rows.append((TARGETS[6], text, all(s["status"] == "passed" for s in ran) if ran else None))
    return rows


def write(out, command=None, dry=False):
    steps = {}
    for p in sorted(glob.glob(os.path.join(out, "steps", "*.json"))):
        d = load(out, os.path.basename(p)[:-5])
        steps[d.get("step", os.path.basename(p)[:-5])] = d
    rows = targets(steps)
    if dry:  # CPU figures of small sizes say nothing of a GPU target
        rows = [(t, f"dry run, CPU: {v}", None) for t, v, _ in rows]
    m = machine()
    report = {"machine": m, "command": command, "written": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
              "steps": list(steps.values()),
              "targets": [{"target": t, "measured": v, "met": ok} for t, v, ok in rows]}
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    md = [f"# GPU run: {m.get('gpu') or 'no GPU'}", "",
          f"commit {m.get('commit')}; command `{command}`; written {report['written']}", "",
          "| step | status | wall s | checks | figures |", "|---|---|---|---|---|"]
    for s in steps.values():
        checks = s.get("checks", [])
        bad = [c["what"] for c in checks if not c["ok"]]
        status = s.get("status", "?") + (f" ({s['reason']})" if s.get("reason") else "")
        figs = "; ".join(f"{k} = {v}" for k, v in list(s.get("figures", {}).items())[:12])
        more = len(s.get("figures", {})) - 12
        md.append(f"| {s.get('step')} | {status} | {s.get('wall_s', '')} | {len(checks) - len(bad)}/{len(checks)} | "
                  f"{figs}{f' (+{more} in report.json)' if more > 0 else ''} |")
    md += ["", "| target | measured | met? |", "|---|---|---|"]
    md += [f"| {t} | {v} | {'-' if ok is None else 'yes' if ok else 'NO'} |" for t, v, ok in rows]
    failed = [(s.get("step"), c["what"]) for s in steps.values() for c in s.get("checks", []) if not c["ok"]]
    if failed:
        md += ["", "## Failed checks", ""] + [f"- {st}: {w}" for st, w in failed[:60]]
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    return report


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("out")
    r.add_argument("step")
    r.add_argument("--status", choices=("passed", "failed", "skipped"))
    r.add_argument("--reason")
    r.add_argument("--rc", type=int)
    r.add_argument("--wall", type=int)
    r.add_argument("--timeout", type=int)
    r.add_argument("--figure", action="append", default=[])
    n = sub.add_parser("ncu")
    n.add_argument("out")
    n.add_argument("step")
    n.add_argument("csv")
    w = sub.add_parser("write")
    w.add_argument("out")
    w.add_argument("--command")
    w.add_argument("--dry-run", action="store_true", help="no target is judged (CPU figures)")
    a = ap.parse_args(argv)
    if a.cmd == "record":
        d = record(a.out, a.step, a.status, a.reason, a.rc, a.wall, a.timeout, a.figure)
        if a.status or a.rc is not None:
            print(f"== {a.step}: {d.get('status')}{' (' + d['reason'] + ')' if d.get('reason') else ''}", flush=True)
    elif a.cmd == "ncu":
        try:
            with open(a.csv) as f:
                figs = ncu_figures(f.read())
        except OSError:
            figs = {}
        record(a.out, a.step, figures=[f"{k}={v}" for k, v in figs.items()])
        for k, v in figs.items():
            print(f"  {k} = {v}", flush=True)
    else:
        rep = write(a.out, a.command, a.dry_run)
        for t in rep["targets"]:
            print(f"  target: {t['target']}: {t['measured']} -> {'-' if t['met'] is None else 'yes' if t['met'] else 'NO'}")
        print(f"report: {os.path.join(a.out, 'report.md')} and report.json", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
