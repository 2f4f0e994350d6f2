"""`hookstats report` of a folder of runs with --jobs above 1: each run folder reported in a worker process (spawned,
so no state of this process is shared), its printed lines and warnings sent back and printed here in the folders'
order, as one process would print them. The CPU time is the same or a little more (each worker imports matplotlib
once); the wall time is about divided by the number of workers where that many CPUs are free."""
import concurrent.futures
import multiprocessing

from .progress import progress


def report_in_processes(tasks, jobs, report_one, show_progress=False, log=print, warn=print):
    """tasks: (run folder, charts folder or None) pairs; report_one(run, out) -> (what it printed and warned, in
    order, as ("out" or "err", text) pairs; its error line or None), a module-level function (a worker process
    imports it by name). Returns None, or the first failing run's error line (the runs after it in order are not
    printed; those already drawn keep their charts)."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool, \
            progress(total=len(tasks), desc="run folders", unit="run", enabled=show_progress) as bar:
        futures = [pool.submit(report_one, run, out) for run, out in tasks]
        for future in futures:
            said, failed = future.result()
            for stream, text in said:
                (log if stream == "out" else warn)(text)
            bar.update()
            if failed is not None:
                pool.shutdown(cancel_futures=True)
                return failed
    return None

