"""What a resumed run supersedes in a history file, as TensorBoard's purge_step: every line of a step at or after
the step the run resumes at is dropped from the file (rewritten beside it, then renamed over it, so a reader or a
crash sees the old file or the new one), so that any reader of the file, not only ours, sees each step once."""
import os

RUN = object()  # step_of's answer for a run header


def drop_steps_from(path, first, step_of):
    """Drops from the text file `path` each line that step_of(line) gives a step >= `first`. step_of gives a
    line's step, None for a line to keep whatever the step (a file header, a torn line), or RUN for a run header,
    kept only when a kept line of its run follows. Returns the number of lines dropped (0: the file untouched)."""
    if not os.path.exists(path):
        return 0
    tmp = path.with_name(path.name + ".purge")
    dropped, header = 0, None
    with open(path, encoding="utf-8", errors="surrogateescape", newline="") as src, \
            open(tmp, "w", encoding="utf-8", errors="surrogateescape", newline="") as out:
        for line in src:
            step = step_of(line)
            if step is RUN:
                if header is not None:
                    dropped += 1
                header = line
                continue
            if step is not None and step >= first:
                dropped += 1
                continue
            if header is not None:
                out.write(header)
                header = None
            out.write(line)
        dropped += header is not None
    if dropped:
        os.replace(tmp, path)
    else:
        os.unlink(tmp)
    return dropped
