"""benchmarks/gpu_run.sh without a GPU: its dry run (argument parsing, the step runner with its timeouts, the
CPU-possible part of the steps, the report) and the report writer (benchmarks/gpu_report.py) on made-up steps:
a timeout or an exit status fails a step, skips say why, the targets are judged from the figures."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import gpu_report  # noqa: E402

RUN = os.path.join(ROOT, "benchmarks", "gpu_run.sh")


def dry_run(out, *args, timeout=600):
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    return subprocess.run(["bash", RUN, "--dry-run", "--out", str(out), *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


@pytest.mark.slow  # six steps of the GPU machine's script, each a new process (the correctness checks on CPU): minutes
def test_dry_run_runs_the_cpu_part_and_writes_the_report(tmp_path):
    r = dry_run(tmp_path, "--only", "0-env,1-build,2-correctness,3-graphs,4-memcheck,6-ncu", "--cap-scale", "4")
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads((tmp_path / "report.json").read_text())
    steps = {s["step"]: s for s in rep["steps"]}
    assert sorted(steps) == ["0-env", "1-build", "2-correctness", "3-graphs", "4-memcheck", "6-ncu"]
    assert steps["0-env"]["status"] == "passed" and steps["0-env"]["figures"]["gvisor"] in (0, 1)
    assert steps["1-build"]["status"] == "skipped" and "dry run" in steps["1-build"]["reason"]
    corr = steps["2-correctness"]
    assert corr["status"] == "passed" and len(corr["checks"]) > 200, corr["checks"][:3]
    assert any("invariants" in c["what"] for c in corr["checks"])
    assert steps["3-graphs"]["status"] == "skipped" and "GPU" in steps["3-graphs"]["reason"]
    for s in ("4-memcheck", "6-ncu"):
        assert "dry run" in steps[s]["reason"] and steps[s]["rc"] == 0
    assert all(t["met"] is None for t in rep["targets"]), "a dry run judges no GPU target"
    md = (tmp_path / "report.md").read_text()
    assert "| 2-correctness | passed |" in md and "| target | measured | met? |" in md
    log = (tmp_path / "gpu_run.log").read_text()
    assert "== 2-correctness (timeout" in log and "- ok " in log  # the steps' output teed as they go


def test_a_step_past_the_budget_is_skipped_and_the_run_exits_0(tmp_path):
    r = dry_run(tmp_path, "--only", "0-env,5-bandwidth", "--budget", "18")
    assert r.returncode == 0, r.stderr[-3000:]
    steps = {s["step"]: s for s in json.loads((tmp_path / "report.json").read_text())["steps"]}
    assert steps["5-bandwidth"]["status"] == "skipped" and steps["5-bandwidth"]["reason"] == "time budget spent"


def sleeping(seconds):
    """Processes running `sleep <seconds>`."""
    found = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                if f.read().split(b"\0")[:2] == [b"sleep", str(seconds).encode()]:
                    found.append(int(d))
        except (OSError, ValueError):
            pass
    return found


def test_cap_scale_multiplies_each_step_cap_but_the_builds_and_no_watchdog_outlives_the_run(tmp_path):
    """3-graphs' cap of 20 s times 37: 740 s, a number no other process sleeps. A watchdog's sleep left behind held
    the run's output open, so whoever read it waited out the last step's cap."""
    r = dry_run(tmp_path, "--only", "1-build,3-graphs", "--cap-scale", "37", "--build-timeout", "40", "--budget", "2000",
                timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    log = (tmp_path / "gpu_run.log").read_text()
    assert "== 1-build (timeout 40 s" in log and "== 3-graphs (timeout 740 s" in log, log[:600]
    assert sleeping(740) == []


@pytest.mark.parametrize("args,words", [(["--budget", "8m"], "--budget takes seconds"),
                                        (["--cap-scale", "0"], "--cap-scale takes a whole number"),
                                        (["--frobnicate"], "unknown argument --frobnicate")])
def test_bad_arguments_are_refused(tmp_path, args, words):
    r = subprocess.run(["bash", RUN, *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and words in r.stderr


# ---------------------------------------------------------------- the report writer alone
def test_record_fails_a_step_that_timed_out_or_exited_non_zero(tmp_path):
    out = str(tmp_path)
    gpu_report.save(out, "2-correctness", {"step": "2-correctness", "status": "passed", "checks": [], "figures": {}})
    assert gpu_report.record(out, "2-correctness", rc=124, wall=100, timeout=100)["status"] == "failed"
    assert "timed out after 100 s" in gpu_report.load(out, "2-correctness")["reason"]
    assert gpu_report.record(out, "3-graphs", rc=1, wall=3, timeout=40)["reason"] == "exit status 1"
    assert gpu_report.record(out, "0-env", rc=0, wall=1, timeout=20, figures=["cores=16"])["status"] == "passed"
    assert gpu_report.load(out, "0-env")["figures"]["cores"] == 16
    d = gpu_report.record(out, "4-racecheck", status="skipped", reason="gVisor (no compute-sanitizer there)")
    assert d["status"] == "skipped"
    d = gpu_report.record(out, "4-racecheck", rc=0, wall=0, timeout=60)
    assert d["status"] == "skipped", "a skip the step recorded stays a skip"


def test_targets_are_judged_from_the_figures(tmp_path):
    out = str(tmp_path)
    figures = {"ratio/bfloat16/256MB/N(0,1)/float buckets": 0.81, "ratio/bfloat16/1024MB/zeros/float buckets": 0.76,
               "ratio/float32/256MB/N(0,1)/float buckets": 0.95, "ratio/float32/1024MB/N(0,1)/float buckets": 0.88,
               "ratio/bfloat16/1MB/N(0,1)/float buckets": 0.1,  # below 256 MB: not a target
               "latency/bfloat16/1024KB": 6.5, "latency/float32/1024KB": 7.9}
    gpu_report.save(out, "5-bandwidth", {"step": "5-bandwidth", "status": "passed", "checks": [], "figures": figures})
    gpu_report.save(out, "7-train", {"step": "7-train", "status": "passed", "checks": [], "figures": {
        "gpt2-small/overhead/hookstats defaults": 0.02, "gpt2-small/plan/overhead": 0.026}})
    gpu_report.save(out, "2-correctness", {"step": "2-correctness", "status": "failed", "figures": {},
                                           "checks": [{"what": "a", "ok": True}, {"what": "b", "ok": False}]})
    gpu_report.save(out, "4-memcheck", {"step": "4-memcheck", "status": "passed", "checks": [], "figures": {}})
    gpu_report.save(out, "4-racecheck", {"step": "4-racecheck", "status": "skipped", "reason": "gVisor",
                                         "checks": [], "figures": {}})
    rep = gpu_report.write(out, "test")
    met = {t["target"]: t["met"] for t in rep["targets"]}
    assert met[gpu_report.TARGETS[0]] is True       # bf16: 81%, 76% >= 75%
    assert met[gpu_report.TARGETS[1]] is False      # fp32: 88% at 1 GB < 90%
    assert met[gpu_report.TARGETS[2]] is True       # 6.5 and 7.9 us <= 8
    assert met[gpu_report.TARGETS[3]] is True       # +2% <= 3%
    assert met[gpu_report.TARGETS[4]] is False      # 2.6% vs 2.0%: 30% apart
    assert met[gpu_report.TARGETS[5]] is False      # one check failed
    assert met[gpu_report.TARGETS[6]] is True       # memcheck clean, racecheck skipped (gVisor) and said so
    md = (tmp_path / "report.md").read_text()
    assert "## Failed checks" in md and "- 2-correctness: b" in md and "racecheck: skipped (gVisor)" in md


NCU_CSV = '''==PROF== Connected to process 1
"ID","Kernel Name","dram__throughput.avg.pct_of_peak_sustained_elapsed","smsp__issue_active.avg.pct_of_peak_sustained_active","l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_atom.sum","smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio","smsp__average_warps_issue_stalled_wait_per_issue_active.ratio","smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio","smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio"
"","","%","%","","inst","inst","inst","inst"
"0","void hookstats::cuda_kernel::dense_kernel<__nv_bfloat16, 0, 0, 1>(...)","82.5","61.2","1,234","3.10","0.40","0.05","1.20"
"1","void hookstats::cuda_kernel::dense_kernel<__nv_bfloat16, 0, 0, 1>(...)","55.0","90.1","98,765","0.90","0.30","0.02","4.50"
'''


def test_ncu_figures_from_the_csv():
    f = gpu_report.ncu_figures(NCU_CSV)
    assert f["N(0,1)/memory throughput, % of peak"] == 82.5 and f["zeros/issue active, %"] == 90.1
    assert f["zeros/shared-atomic bank conflicts"] == 98765
    assert f["N(0,1)/stall 1"] == "long_scoreboard 3.10" and f["zeros/stall 1"] == "mio_throttle 4.50"
    assert gpu_report.ncu_figures("==ERROR== profiling is not supported\n") == {}


def test_the_step_caps_fit_the_default_budget():
    """Every step gets its whole cap in a default run: the caps add up to no more than the deadline (budget - 15 s
    for the report), so no step is skipped or cut short for the time an earlier one was allowed."""
    import re
    text = open(RUN).read()
    budget = int(re.search(r"\bbudget=(\d+)", text).group(1))
    build = int(re.search(r"\bbuild_cap=(\d+)", text).group(1))
    caps = [build if cap == '"$build_cap"' else int(cap) for cap in re.findall(r"^run_step \S+ (\S+)$", text, re.M)]
    assert len(caps) == 10 and sum(caps) <= budget - 15, (caps, sum(caps), budget)


def test_a_timed_out_step_ends_everything_it_started(tmp_path):
    """A step's timeout ends its whole process group (a build's compilers, a sanitizer's target), not only the
    shell that runs it: here a stand-in python that leaves a grandchild behind."""
    marker = f"hookstats-orphan-{os.getpid()}"
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/bash\n(exec -a {marker} sleep 300) &\nsleep 300\n")
    fake.chmod(0o755)
    out = tmp_path / "out"
    env = dict(os.environ, PYTHON=str(fake))
    r = subprocess.run(["bash", RUN, "--dry-run", "--out", str(out), "--only", "2-correctness", "--budget", "25"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    step = json.loads((out / "steps" / "2-correctness.json").read_text())
    assert step["status"] == "failed" and "timed out" in step["reason"], step
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    for pid in left:  # clean up before asserting
        subprocess.run(["kill", "-9", pid])
    assert not left, f"the step's grandchild outlived its timeout: {left}"


def test_a_sanitizer_that_timed_out_is_not_run_not_unclean(tmp_path):
    out = str(tmp_path)
    gpu_report.save(out, "4-memcheck", {"step": "4-memcheck", "checks": [], "figures": {}})
    gpu_report.record(out, "4-memcheck", rc=124, wall=30, timeout=30)
    met = {t["target"]: t["met"] for t in gpu_report.write(out, "test")["targets"]}
    assert met[gpu_report.TARGETS[6]] is None


def test_a_step_never_compiles_the_op(tmp_path):
    """The steps take the op step 1-build built; without one they fail at once, never compiling it inside their
    timeout."""
    tree = tmp_path / "tree"
    tree.mkdir()
    env = dict(os.environ, GPU_RUN_TREE=str(tree))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu_steps.py"), "correctness", "--dry-run",
                        "--out", str(tmp_path)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 1
    step = json.loads((tmp_path / "steps" / "correctness.json").read_text())
    assert "not built" in step["checks"][0]["what"], step
