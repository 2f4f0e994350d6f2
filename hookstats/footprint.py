"""The bytes a monitor holds (mon.memory()): its states and flags on the devices, and its history's rings, host
staging buffers and the steps mon.history() keeps."""


def memory(state_bytes, history=None):
    """Bytes held: `state_bytes` (running states and sampling flags on the devices, StateStore.nbytes()), plus, from
    `history` (a History or None), its rings, host staging buffers and the steps mon.history() keeps on the host
    (host_history_bytes, growing up to `keep` steps)."""
    dev, host = history.nbytes() if history is not None else (0, 0)
    kept = history.memory_sink.nbytes() if history is not None else 0
    return {"state_bytes": state_bytes, "history_bytes": dev, "host_staging_bytes": host,
            "host_history_bytes": kept, "device_bytes": state_bytes + dev}
