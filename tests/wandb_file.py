"""Reads an offline W&B run file back without wandb's service: the .wandb file is a LevelDB-style log of
wandb Record protobufs (32 KiB blocks, 7-byte chunk headers), written by wandb-core."""
import json
import struct
import time


def read_history(path, record="history"):
    """History rows (record="history") or summary updates (record="summary") of an offline .wandb file: LevelDB-style
    log records holding wandb Record protobufs."""
    from wandb.proto import wandb_internal_pb2 as pb
    data = open(path, "rb").read()
    pos, block, pieces, rows = 7, 32768, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, n, kind = struct.unpack("<IHB", data[pos: pos + 7])
        if kind == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7: pos + 7 + n], pos + 7 + n
        pieces = chunk if kind in (1, 2) else pieces + chunk
        if kind in (1, 4):
            rec = pb.Record()
            try:
                rec.ParseFromString(pieces)
            except Exception:  # the last record, still being written by wandb-core: read again later
                break
            if rec.WhichOneof("record_type") == record:
                items = rec.history.item if record == "history" else rec.summary.update
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items})
    return rows


def offline_history(run, min_rows=1, timeout=20):
    """History rows of an offline run (its settings.sync_file: wandb keeps the first WANDB_DIR it saw in a
    process), waiting for wandb-core to finish writing after run.finish()."""
    run_file = run.settings.sync_file
    deadline = time.monotonic() + timeout
    while len(rows := read_history(run_file)) < min_rows and time.monotonic() < deadline:
        time.sleep(0.2)
    return rows


def offline_summary(run, key, timeout=20):
    """The last value an offline run's summary was given for `key` (None if none within `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        got = [u[key] for u in read_history(run.settings.sync_file, "summary") if key in u]
        if got or time.monotonic() > deadline:
            return got[-1] if got else None
        time.sleep(0.2)
