"""Every chart of one run under one progress bar that counts them all, for `hookstats report` and the demo: the
charts of the recorded steps (plots.save_all), the low-precision what-if figure (lowprec.png), the gradient norms
(grad_norms.png) and the flight recorder's charts (flight_<step>.png)."""
from functools import partial
from pathlib import Path

from .lowprec_plots import save_run_lowprec


def grad_norms_chart(norms):
    """[(file name, draw(path))] of grad_norms.png; [] where the run has no parameter gradients."""
    from .flight_plots import plot_grad_norms
    return [("grad_norms.png", partial(plot_grad_norms, norms))] if norms.targets else []


def flight_charts(folder):
    """[(file name, draw(path))] of the flight files in a run folder (flight_<step>.png each)."""
    from ..sinks.flight_file import find_flights, read_flight
    from .flight_plots import plot_flight
    return [(f"{f.stem}.png", lambda path, f=f: plot_flight(read_flight(f), path=path)) for f in find_flights(folder)]


def save_run_charts(series, items, out, bar, run_totals=None, extras=()):
    """Draws every chart of a run into `out` and returns their paths: the steps' charts, the what-if figure where
    the history has its fields, then `extras` ((file name, draw(path)), e.g. grad_norms_chart()). bar(): a progress
    bar (hookstats.tools.progress.progress with its desc and unit bound) that counts each chart as it is drawn."""
    from . import plots
    out, extras = Path(out), list(extras)
    paths = []
    with bar() as counter:
        def counted(charts):
            counter.total = len(charts) + 1 + len(extras)  # 1: the what-if figure, until it turns out to have none
            counter.refresh()
            for chart in charts:
                yield chart
                counter.update()

        paths += plots.save_all(series, out, run_totals=run_totals, progress=counted)
        lowprec = save_run_lowprec(items, out)
        if lowprec:
            counter.update()
        else:
            counter.total -= 1
            counter.refresh()
        paths += lowprec
        for name, draw in extras:
            draw(path=out / name)
            paths.append(out / name)
            counter.update()
    return paths
