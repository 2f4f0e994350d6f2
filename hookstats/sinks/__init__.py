"""Sinks: where per-step records go, several at once. Each is a small subclass of Sink (base.py: the write
protocol, the record format and the dashboard selection), one file each; a user's sink too, or any object with
write(step, records)."""
from pathlib import Path

from .base import DASHBOARD_CHOICES, DASHBOARD_STATS, SCALARS, Sink, SkippedLinesWarning, Steps
from .csv import CSVSink, read_csv
from .columns import Columns
from .jsonl import JSONLSink, read_jsonl, read_jsonl_columns
from .fields import BadRecordWarning
from .memory import MemorySink
from .runs import HistoryFileWarning, LayoutWarning, RunsWarning
from .tensorboard import TensorBoardSink
from .wandb import WandbSink

HISTORY_CSV, HISTORY_JSONL, TENSORBOARD_DIR = "history.csv", "history.jsonl", "tensorboard"


def read_history(path):
    """(items, alerts) of a saved history: a history.jsonl or history.csv file (by its suffix), or a run folder
    holding one (history.jsonl preferred: it has the histograms)."""
    columns, alerts = read_history_columns(path)
    return columns.items(), alerts


def history_file(path):
    """The history file read_history() reads for `path`: the file itself, or a run folder's history.jsonl (it has
    the histograms), else its history.csv."""
    path = Path(path)
    if path.is_dir():
        jsonl = path / HISTORY_JSONL
        path = jsonl if jsonl.is_file() else path / HISTORY_CSV
    return path


def read_history_columns(path, progress=None):
    """read_history() as (columns.Columns, alerts): a JSONL file read into columns line by line, a CSV file's
    records put in columns. progress(n): n more characters of the file read, every megabyte or so."""
    path = history_file(path)
    if not path.is_file():
        raise FileNotFoundError(f"no history file at {path}")
    if path.suffix == ".csv":
        items, alerts = read_csv(path, progress)
        return Columns.from_items(items), alerts
    if path.suffix == ".jsonl":
        return read_jsonl_columns(path, progress)
    raise ValueError(f"{path}: a hookstats history is a .jsonl or .csv file")


def run_dir_sinks(out_dir, tensorboard=True):
    """The sinks of a run folder that `hookstats report` reads: history.csv, history.jsonl, tensorboard/."""
    out = Path(out_dir)
    sinks = [CSVSink(out / HISTORY_CSV), JSONLSink(out / HISTORY_JSONL)]
    if tensorboard:
        sinks.append(TensorBoardSink(out / TENSORBOARD_DIR))
    return sinks


__all__ = ["DASHBOARD_CHOICES", "DASHBOARD_STATS", "SCALARS", "Sink", "Steps", "SkippedLinesWarning",
           "BadRecordWarning", "HistoryFileWarning", "RunsWarning", "LayoutWarning", "CSVSink", "JSONLSink",
           "MemorySink", "TensorBoardSink", "WandbSink", "read_csv", "read_jsonl", "read_history",
           "read_history_columns", "history_file", "run_dir_sinks"]
