"""CSVSink: the long table (step, target, module, kind, leaf, phase, stat, value), one row per scalar statistic
(phase: "train", or "eval" for a validation pass, stamped with the step it ran in; an empty value where a
statistic does not exist for that row, e.g. a figure of the histograms on a step that counted none);
alerts go to a sibling file <stem>_alerts.csv. read_csv() loads the table back for `hookstats report`."""
import csv
import math
from pathlib import Path

from .. import statistics
from ..phases import Phase, record_phase
from . import claim, fields, purge
from .base import KEY_FIELDS, SCALARS, file_lines, open_parent, warn_skipped
from .runs import Ledger, run_header

COLUMNS = ("step", "target", "module", "kind", "leaf", "phase", "stat", "value")
OLD_COLUMNS = ("step", "target", "module", "kind", "leaf", "stat", "value")  # files of versions without phases
ALERT_COLUMNS = ("step", "target", "kind", "message")
INT_SCALARS = tuple(s for s in SCALARS if statistics.BY_NAME[s].type == statistics.INT)
# Marker rows (empty target): a run header when the sink opens its file (the run id in `leaf`) and a step end
# after each step's rows (the number of its records in `value`); see runs.py.
RUN, STEP_END = "#run", "#step_end"


class CSVSink(claim.FileSink):
    """path: the file. Rows are appended after a run marker row, each step's followed by a step-end row (a
    resumed run keeps the earlier rows of the steps before its own, resume()); one process writes a file at a
    time (claim.py), and under torch.distributed rank r > 0 writes `<stem>.rank<r>.csv`."""

    def __init__(self, path):
        super().__init__(path)
        self.alerts_path = self.path.with_name(self.path.stem + "_alerts.csv")
        self._file = self._alerts = None

    def _open(self, step):
        if self._file is None:
            self._file, self._writer = _open_table(self.claim(), COLUMNS)
            self._writer.writerow((step, "", "", RUN, run_header(self.run_id)["run"], "", "run", "nan"))
        return self._writer

    def write(self, step, records):
        w = self._open(step)
        for rec in records:
            for stat, v in self.values(rec):
                w.writerow((step, rec["target"], rec["module"], rec["kind"], rec["leaf"], record_phase(rec),
                            stat, repr(v)))
        w.writerow((step, "", "", STEP_END, "", "", "targets", len(records)))
        self._file.flush()

    def write_alerts(self, step, alerts):
        self._open(step)
        if self._alerts is None:
            path = self.claim()
            self._alerts, self._alert_writer = _open_table(path.with_name(path.stem + "_alerts.csv"), ALERT_COLUMNS)
        for a in alerts:
            self._alert_writer.writerow((a["step"], a["target"], a["kind"], a["message"]))
        self._alerts.flush()

    def superseded(self, path):
        return [(path, _step_of), (path.with_name(path.stem + "_alerts.csv"), _step_of)]

    def close_files(self):
        files, self._file, self._alerts = (self._file, self._alerts), None, None
        errors = []
        for f in files:
            if f is not None:
                try:
                    f.close()
                except OSError as e:  # a full disk: the other file is closed all the same
                    errors.append(e)
        if errors:
            raise errors[0]


def _step_of(line):
    """The step of a line of a CSVSink file or its alerts file (purge.drop_steps_from), RUN for a run marker."""
    cells = line.split(",", 4)
    if cells[1:4] == ["", "", RUN]:
        return purge.RUN
    return int(cells[0]) if cells[0].isdigit() else None


def _open_table(path, columns):
    """(file, csv writer) of a CSV file to append to: a new or empty one gets its header row, an existing one
    must have it."""
    f = open_parent(path, "a")
    writer = csv.writer(f)
    if f.tell() == 0:
        writer.writerow(columns)
        return f, writer
    with open(path, "rb") as r:
        first = r.readline().rstrip(b"\r\n").decode("utf-8", "replace")
        r.seek(-1, 2)
        torn = r.read(1) != b"\n"
    if tuple(first.split(",")) != columns:
        f.close()
        raise ValueError(f"{path} is not a hookstats CSV (expected columns {','.join(columns)}): not appending to it")
    if torn:
        f.write("\r\n")  # a torn last line stays one skipped line, not glued to the next row
    return f, writer


def read_csv(path, progress=None):
    """(step, record) pairs with the scalar statistics of a CSVSink file, by step, and its alerts. Lines that
    are not whole rows (a run that died while writing) are skipped with one SkippedLinesWarning per file, rows
    with a bad field with one BadRecordWarning each (fields.py); runs, duplicates and incomplete steps:
    runs.Ledger (the last written record of a (step, target) wins). An empty file, or one with the header only,
    holds no steps. progress(n): n more characters of the history read (base.file_lines)."""
    path = Path(path)
    ledger, lines = Ledger(path), fields.BadLines(path)
    rec = None
    for n, step, row in _rows(path, (COLUMNS, OLD_COLUMNS), "step", "value", lines, progress):
        if row["target"] == "" and row["kind"] in (RUN, STEP_END):
            rec = None
            if row["kind"] == RUN:
                ledger.start_run(row["leaf"])
            else:
                ledger.step_end(step)
            continue
        try:
            if row["stat"] in KEY_FIELDS:
                raise fields.BadField("stat", f"{row['stat']!r} is not a statistic")
            value = fields.scalar(row["stat"], row["value"])
            key = {k: fields.key(row.get(k, Phase.TRAIN), k, lines) for k in KEY_FIELDS}
        except ValueError as e:
            lines.add(n, str(e), stacklevel=3)
            continue
        # a record's rows are written one after another: a new (step, target) starts the next record
        if rec is None or step != rec_step or (key["target"], key["phase"]) != (rec["target"], rec["phase"]):
            rec, rec_step = dict(key), step
            ledger.record(step, rec)
        rec[row["stat"]] = value
    alerts_path = path.with_name(path.stem + "_alerts.csv")
    alerts, alert_lines = [], fields.BadLines(alerts_path)
    for n, step, a in _rows(alerts_path, (ALERT_COLUMNS,), "step", None, alert_lines) if alerts_path.exists() else ():
        try:
            fields.alert_kind(a["kind"])
        except ValueError as e:
            alert_lines.add(n, str(e), stacklevel=3)
            continue
        alerts.append({**a, "step": step})
    lines.finish()
    alert_lines.finish()
    items = ledger.items()
    for _, r in items:
        for k in INT_SCALARS:
            if k in r and math.isfinite(r[k]):
                r[k] = int(r[k])
    return items, alerts


def _rows(path, headers, step_col, float_col, lines, progress=None):
    """Yields (line number, step, {column: value}) of each whole row of a file with one of `headers` as its
    header. Line by line, so a torn line cannot pull the next ones into an open quote."""
    read, bad = 0, []
    columns = headers[0]
    for n, text in file_lines(path, bad, progress):
        # csv.writer quotes only fields holding a quote, comma or line break: the rest split plainly
        row = text.split(",") if '"' not in text else next(csv.reader([text]), [])
        if n == 1:
            if tuple(row) not in headers:
                raise ValueError(f"{path} is not a hookstats CSV: expected columns {','.join(columns)}")
            columns = tuple(row)
            read += 1
            continue
        if len(row) != len(columns):
            bad.append(n)
            continue
        row = dict(zip(columns, row))
        try:
            if float_col is not None:
                row[float_col] = float(row[float_col])
        except ValueError:
            bad.append(n)  # a torn value glued to the next row
            continue
        try:
            text = row[step_col]
            step = fields.step(int(text) if text.lstrip("-").isdigit() and len(text) < 25 else text)
        except ValueError as e:
            lines.add(n, str(e), stacklevel=4)
            continue
        read += 1
        yield n, step, row
    warn_skipped(path, bad, read, "a whole CSV row")
