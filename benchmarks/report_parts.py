"""Where one `hookstats report` of a run folder spends its time, part by part, in this process: the imports, reading
the history, deriving the series, the table, each chart. Run by `report_scale.py --breakdown` in a fresh process
with PYTHONPATH set to the checkout to time; prints one JSON object {part: [CPU seconds, wall seconds]}.

The parts are the functions of the report named in PARTS, wrapped by name where the checkout has them, so one
script times this commit and an earlier one alike; each part's time is its own, without the parts it calls (a chart
that reads the table's records counts them to the chart), and "other" is what no part covers. A function named
in two modules is wrapped in the first the checkout has (stats_table: tables.py, before it summary.py, which
imports torch), so the script imports no module the report itself does not."""
import json
import sys
import time
from pathlib import Path

# (module, function, part): a chart's part is its file name, from the path it is drawn to
PARTS = [
    ("hookstats.tools.cli", "load_run", "read"),
    ("hookstats.sinks", "read_history", "read"),
    ("hookstats.tools.plots", "collect", "derive"),
    ("hookstats.tools.plots", "totals", "derive"),
    ("hookstats.tools.plots", "series_of", "derive"),
    ("hookstats.grad_norms", "grad_norms", "derive"),
    ("hookstats.records", "last_records", "table"),
    ("hookstats.tools.tables", "stats_table", "table"),
    ("hookstats.tools.tables", "head_and_tail", "table"),
    ("hookstats.tools.summary", "stats_table", "table"),
    ("hookstats.tools.summary", "head_and_tail", "table"),
    ("hookstats.tools.plots", "plot_layer_stats", None),
    ("hookstats.tools.plots", "plot_layer_stats_overview", None),
    ("hookstats.tools.plots", "plot_hist_heatmap", None),
    ("hookstats.tools.plots", "plot_hist_overview", None),
    ("hookstats.tools.plots", "plot_dynamic_range", None),
    ("hookstats.tools.run_charts", "save_run_lowprec", "chart lowprec.png"),
    ("hookstats.tools.flight_plots", "plot_grad_norms", None),
    ("hookstats.tools.flight_plots", "plot_flight", None),
]


def _clock():
    return time.process_time(), time.perf_counter()


class Parts:
    """Exclusive times per part: a part's time less that of the parts it calls."""

    def __init__(self):
        self.spent, self.stack = {}, []

    def add(self, part, cpu, wall):
        got = self.spent.setdefault(part, [0.0, 0.0])
        got[0] += cpu
        got[1] += wall

    def wrap(self, fn, part):
        def timed(*args, **kwargs):
            name = part or f"chart {Path(kwargs.get('path') or 'unnamed').name}"
            self.stack.append([0.0, 0.0])
            c0, w0 = _clock()
            try:
                return fn(*args, **kwargs)
            finally:
                c1, w1 = _clock()
                inner = self.stack.pop()
                cpu, wall = c1 - c0, w1 - w0
                self.add(name, cpu - inner[0], wall - inner[1])
                if self.stack:
                    self.stack[-1][0] += cpu
                    self.stack[-1][1] += wall
        return timed


def main(run, out):
    import importlib
    c0, w0 = _clock()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.figure  # noqa: F401
    import hookstats  # noqa: F401
    from hookstats.tools import cli
    wrapped = set()
    found = []
    for module, name, part in PARTS:
        if name in wrapped:
            continue
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        if callable(getattr(mod, name, None)):
            wrapped.add(name)
            found.append((mod, name, part))
    c1, w1 = _clock()
    parts = Parts()
    parts.add("import", c1 - c0, w1 - w0)
    for mod, name, part in found:
        setattr(mod, name, parts.wrap(getattr(mod, name), part))
    c2, w2 = _clock()
    cli.report(Path(run), Path(out), log=lambda text: None, warn=lambda text: None)
    c3, w3 = _clock()
    counted = [sum(v[i] for k, v in parts.spent.items() if k != "import") for i in (0, 1)]
    parts.add("other", c3 - c2 - counted[0], w3 - w2 - counted[1])
    total = [c3 - c0, w3 - w0]
    print(json.dumps({**{k: [round(v[0], 3), round(v[1], 3)] for k, v in parts.spent.items()},
                      "total": [round(total[0], 3), round(total[1], 3)]}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
