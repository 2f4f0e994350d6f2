"""Sinks: where per-step records go. Several at once; a user sink is any object with write(step, records)
and close() (and optionally write_alerts(step, alerts)). See base.py for the record format."""
from pathlib import Path

from .base import SCALARS
from .csv import CSVSink, read_csv
from .jsonl import JSONLSink, read_jsonl
from .memory import MemorySink
from .tensorboard import TensorBoardSink
from .wandb import WandbSink

HISTORY_CSV, HISTORY_JSONL, TENSORBOARD_DIR = "history.csv", "history.jsonl", "tensorboard"


def run_dir_sinks(out_dir, tensorboard=True):
    """The sinks of a run folder that `hookstats report` reads: history.csv, history.jsonl, tensorboard/."""
    out = Path(out_dir)
    sinks = [CSVSink(out / HISTORY_CSV), JSONLSink(out / HISTORY_JSONL)]
    if tensorboard:
        sinks.append(TensorBoardSink(out / TENSORBOARD_DIR))
    return sinks


__all__ = ["SCALARS", "CSVSink", "JSONLSink", "MemorySink", "TensorBoardSink", "WandbSink", "read_csv", "read_jsonl",
           "run_dir_sinks"]
