"""PlainStrEnum: the base of the vocabularies (Kind, Phase) whose members are plain strings to everything else."""
import enum


class PlainStrEnum(str, enum.Enum):
    """A str that prints, formats, hashes and reprs as its plain value, so ids, records, saved files and arguments
    read as plain strings did, and a key made with the plain string finds what the member keyed."""
    __str__ = str.__str__
    __repr__ = str.__repr__
    __format__ = str.__format__
    __hash__ = str.__hash__
