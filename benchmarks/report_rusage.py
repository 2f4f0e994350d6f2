"""Where a report's wall time goes beside its CPU time: one `python -m hookstats report FOLDER` per checkout given,
each in a fresh process, in turn: CPU (user, sys), wall, the largest resident size of any report so far (getrusage
keeps the children's maximum), major faults, blocks read, voluntary (blocked: I/O, locks) and involuntary
(preempted by other jobs) context switches, the load average. One JSON line per report. Usage:
OMP_NUM_THREADS=1 python benchmarks/report_rusage.py FOLDER CHECKOUT [CHECKOUT ...]"""
import json
import os
import resource
import shutil
import subprocess
import sys
import time


def one_report(folder, tree):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "hookstats", "report", folder, "--no-progress"], cwd=tree, check=True,
                   env={**os.environ, "PYTHONPATH": tree, "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"},
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    shutil.rmtree(os.path.join(folder, "charts"), ignore_errors=True)
    return {"tree": tree, "user_s": round(r.ru_utime - before.ru_utime, 2),
            "sys_s": round(r.ru_stime - before.ru_stime, 2), "wall_s": round(wall, 2),
            "max_rss_mb_so_far": round(r.ru_maxrss / 1024), "major_faults": r.ru_majflt - before.ru_majflt,
            "block_reads": r.ru_inblock - before.ru_inblock, "voluntary_switches": r.ru_nvcsw - before.ru_nvcsw,
            "involuntary_switches": r.ru_nivcsw - before.ru_nivcsw, "load": round(os.getloadavg()[0], 1)}


if __name__ == "__main__":
    for checkout in sys.argv[2:]:
        print(json.dumps(one_report(sys.argv[1], checkout)), flush=True)
