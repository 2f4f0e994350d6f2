"""CSVSink: the long table (step, target, module, kind, leaf, phase, stat, value), one row per scalar statistic
(phase: "train", or "eval" for a validation pass, stamped with the step it ran in; an empty value where a
statistic does not exist for that row, e.g. a figure of the histograms on a step that counted none);
alerts go to a sibling file <stem>_alerts.csv. read_csv() loads the table back for `hookstats report`."""
import csv
import math
from pathlib import Path

from .. import statistics
from .base import KEY_FIELDS, SCALARS, file_lines, open_parent, scalar_items, warn_skipped

COLUMNS = ("step", "target", "module", "kind", "leaf", "phase", "stat", "value")
OLD_COLUMNS = ("step", "target", "module", "kind", "leaf", "stat", "value")  # files of versions without phases
ALERT_COLUMNS = ("step", "target", "kind", "message")
INT_SCALARS = tuple(s for s in SCALARS if statistics.BY_NAME[s].type == statistics.INT)


class CSVSink:
    def __init__(self, path):
        self.path = Path(path)
        self.alerts_path = self.path.with_name(self.path.stem + "_alerts.csv")
        self._file = self._alerts = None

    def write(self, step, records):
        if self._file is None:
            self._file, self._writer = _open_table(self.path, COLUMNS)
        for rec in records:
            for stat, v in scalar_items(rec):
                self._writer.writerow((step, rec["target"], rec["module"], rec["kind"], rec["leaf"],
                                       rec.get("phase") or "train", stat, repr(v)))
        self._file.flush()

    def write_alerts(self, step, alerts):
        if self._alerts is None:
            self._alerts, self._alert_writer = _open_table(self.alerts_path, ALERT_COLUMNS)
        for a in alerts:
            self._alert_writer.writerow((a["step"], a["target"], a["kind"], a["message"]))
        self._alerts.flush()

    def close(self):
        for f in (self._file, self._alerts):
            if f is not None:
                f.close()
        self._file = self._alerts = None


def _open_table(path, columns):
    """(file, csv writer) of a new CSV file holding its header row."""
    f = open_parent(path, "w")
    writer = csv.writer(f)
    writer.writerow(columns)
    return f, writer


def read_csv(path):
    """(step, record) pairs with the scalar statistics of a CSVSink file, in file order, and its alerts.
    Lines that are not whole rows (a run that died while writing) are skipped with one SkippedLinesWarning
    per file; an empty file, or one with the header only, holds no steps."""
    path = Path(path)
    recs = {}
    for step, row in _rows(path, (COLUMNS, OLD_COLUMNS), "step", "value"):
        phase = row.get("phase") or "train"
        rec = recs.get((step, row["target"], phase))
        if rec is None:
            rec = recs[(step, row["target"], phase)] = {k: row.get(k, phase) for k in KEY_FIELDS}
        rec[row["stat"]] = row["value"]
    alerts_path = path.with_name(path.stem + "_alerts.csv")
    alerts = [{**a, "step": step} for step, a in _rows(alerts_path, (ALERT_COLUMNS,), "step")] \
        if alerts_path.exists() else []
    items = [(step, rec) for (step, _, _), rec in recs.items()]
    for _, rec in items:
        for k in INT_SCALARS:
            if k in rec and math.isfinite(rec[k]):
                rec[k] = int(rec[k])
    return items, alerts


def _rows(path, headers, step_col, float_col=None):
    """Yields (step, {column: value}) of each whole row of a file with one of `headers` as its header. Line by
    line, so a torn line cannot pull the next ones into an open quote."""
    read, bad = 0, []
    columns = headers[0]
    for n, text in file_lines(path, bad):
        # csv.writer quotes only fields holding a quote, comma or line break: the rest split plainly
        row = text.split(",") if '"' not in text else next(csv.reader([text]), [])
        if n == 1:
            if tuple(row) not in headers:
                raise ValueError(f"{path} is not a hookstats CSV: expected columns {','.join(columns)}")
            columns = tuple(row)
            read += 1
            continue
        try:
            if len(row) != len(columns):
                raise ValueError
            row = dict(zip(columns, row))
            if float_col is not None:
                row[float_col] = float(row[float_col])
            step = int(row[step_col])
        except ValueError:
            bad.append(n)
            continue
        read += 1
        yield step, row
    warn_skipped(path, bad, read, "a whole CSV row")
