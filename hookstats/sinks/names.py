"""The one naming scheme of every dashboard name hookstats writes (TensorBoardSink tags, WandbSink keys, the HF and
Lightning callbacks' metrics and histograms): `<prefix><module>/<kind><leaf>[@call][/eval]/<stat>`, e.g.
`hookstats/encoder.fc1/output/mean`, `hookstats/lstm/output_0_/std`, `hookstats/fc1/output/eval/near_zero_rel`.
Characters that loggers such as MLflow reject (anything but letters, digits and `_ . - / space`) become `_`.
The eval phase adds `/eval` after the target, so a target's validation charts sit beside its training ones."""
import re

from ..phases import Phase, check_phase, record_phase

PREFIX = "hookstats/"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-/ ]")


def target_name(target, module, phase=Phase.TRAIN, prefix=PREFIX):
    """`<prefix><module>/<kind><leaf>[@call]`, plus `/eval` for the eval phase: the part of a name before the
    statistic. target: the target id ("fc1:output[0]@1"); module: its module name (the id's part before the kind)."""
    check_phase(phase)
    rest = target[len(module) + 1:] if target.startswith(module + ":") else target.split(":", 1)[-1]
    name = prefix + _UNSAFE.sub("_", f"{module or 'model'}/{rest}")
    return name if phase == Phase.TRAIN else f"{name}/{phase}"


def record_name(record, prefix=PREFIX, target=None):
    """target_name() of a record (a history record, or a stats() record with its id as `target`)."""
    target = target if target is not None else record["target"]
    module = record.get("module")
    return target_name(target, target.split(":", 1)[0] if module is None else module, record_phase(record),
                       prefix)


def stat_name(base, stat):
    """The full name of one statistic (or histogram: "hist", "log2_abs") of a target_name()."""
    return f"{base}/{stat}"
