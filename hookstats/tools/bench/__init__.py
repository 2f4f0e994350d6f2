"""The benchmarks behind `python -m hookstats bench` and benchmarks/ (which measure the same thing): the
workloads (models.py), the variants compared (variants.py), step timing (timing.py), host-sync counting
(syncs.py), memory runs in fresh processes (memory.py), the table (table.py) and the command (command.py).
Nothing in the rest of hookstats imports this package."""
from .command import main, run
from .memory import measure_memory, memory_child
from .models import LayerStack, SmallCNN, SmallTransformer, check_workload, make_workload
from .syncs import SyncCounter, count_syncs
from .table import loadavg, machine, table
from .timing import CLOCKS, clock, device, interleaved_step_times, set_clock, set_device, summarize, sync, time_steps, timed_ops
from .variants import (BASELINE, LABELS, NO_HISTOGRAMS, VARIANT_LIST, VARIANTS, Installed, available_variants,
                       hooked_modules, hookstats_kwargs, install_hookstats, reference_backend)

__all__ = ["main", "run", "measure_memory", "memory_child", "LayerStack", "SmallCNN", "SmallTransformer",
           "check_workload", "make_workload", "SyncCounter", "count_syncs", "loadavg", "machine", "table", "CLOCKS",
           "clock", "device", "interleaved_step_times", "set_clock", "set_device", "summarize", "sync", "time_steps",
           "BASELINE", "LABELS", "NO_HISTOGRAMS", "VARIANT_LIST", "VARIANTS", "Installed", "available_variants", "hooked_modules",
           "hookstats_kwargs", "install_hookstats", "reference_backend"]
