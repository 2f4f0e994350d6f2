"""Sinks under torch.distributed: rank 0 (or a process without torch.distributed) writes, the other ranks' sinks
are muted."""
from ..ranks import rank
from .base import check_sinks


class MutedSink:
    """A sink of a rank other than 0: never written, closed with the others."""

    def __init__(self, sink):
        self.sink = sink

    def write(self, step, records):
        pass

    def close(self):
        self.sink.close()

    def __repr__(self):
        return f"MutedSink({self.sink!r})"


def rank_zero_sinks(sinks):
    """attach()'s default: rank 0 (or a process without torch.distributed) keeps its sinks, the other
    ranks get them muted. Decided at attach time: initialize the process group first."""
    sinks = check_sinks(sinks)
    return sinks if rank() == 0 else [MutedSink(s) for s in sinks]
