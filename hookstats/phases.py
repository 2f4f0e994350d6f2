"""The phase a value is measured in (Phase), the phase of a record that names none, and a target's label across
phases: the one place that spells the phases."""
from .plain_enum import PlainStrEnum


class Phase(PlainStrEnum):
    """TRAIN: a root forward in model.train() mode, its backward and what the optimizer step reads; EVAL: a
    validation forward (model.eval(), with attach(eval=True)). A str that prints, formats, hashes and reprs as its
    plain value, as Kind does, so records, saved files and stats(phase="eval") read as plain strings did."""
    TRAIN = "train"
    EVAL = "eval"


PHASES = tuple(p.value for p in Phase)
CHOICES = " or ".join(repr(p) for p in PHASES)  # for messages: 'train' or 'eval'
TRAIN = Phase.TRAIN.value  # the default of a public phase argument: a plain str, as users pass it and autodoc shows


def record_phase(record):
    """A record's phase: TRAIN where it names none (records and files of versions without phases)."""
    return record.get("phase") or Phase.TRAIN


def phase_label(target, phase):
    """A target's name in a table or chart that holds every phase: its id in the train phase, "id (phase)" in
    another, so a target's validation rows sit beside its training ones."""
    return target if phase == Phase.TRAIN else f"{target} ({phase})"


def check_phase(phase):
    """A `phase` argument (a Phase or its plain string), checked."""
    if phase not in PHASES:
        raise ValueError(f"phase must be {CHOICES}, got {phase!r}")
    return phase
