"""One writer per history file: a file sink claims `<file>.lock` (created O_EXCL, holding the writer's pid and
host) before it writes, and releases it on close() or when the sink is garbage-collected. A lock left by a
process that is gone (same host, pid not running) is stale and taken over. Under torch.distributed each rank
but 0 writes its own file, `<stem>.rank<r><suffix>`, so ranks never share one. FileSink: the base of such sinks."""
import json
import os
import socket
import weakref
from pathlib import Path

from .. import ranks
from .base import Sink
from .purge import drop_steps_from

_held = weakref.WeakValueDictionary()  # lock path -> the live Claim of this process holding it


class FileInUseError(RuntimeError):
    """Another live writer holds the history file."""


def check_path(path, who):
    """A sink's path argument, checked: a str or os.PathLike naming a file."""
    if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)) or not str(os.fspath(path)).strip():
        raise ValueError(f"{who}: path must be a file path (str or os.PathLike), got {path!r:.80}")
    path = Path(path)
    above = next((p for p in path.absolute().parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise ValueError(f"{who}: {str(above)!r:.200} is a file, not a folder: {str(path)!r:.200} cannot be made")
    return path


def rank_path(path):
    """`path` for rank 0 or without torch.distributed; `<stem>.rank<r><suffix>` for rank r > 0."""
    r = ranks.rank() if ranks.world_size() > 1 else 0
    return path if r == 0 else path.with_name(f"{path.stem}.rank{r}{path.suffix}")


def lock_path(path):
    return path.with_name(path.name + ".lock")


def holder(path):
    """(pid, host) of the live writer holding `path`'s lock, or None (no lock, or a stale one)."""
    lock = lock_path(path)
    if lock in _held:
        return os.getpid(), socket.gethostname()
    try:
        info = json.loads(lock.read_text())
        pid, host = int(info["pid"]), str(info["host"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return -1, "?"  # a lock being written this instant, or not ours to judge: treat as held
    if host != socket.gethostname():
        return pid, host  # another machine's process: cannot tell whether it runs
    if pid == os.getpid():
        return None  # this process, but no live sink holds it: left by a sink that was never closed
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return pid, host


def _refuse(path, pid, host):
    where = "this process" if pid == os.getpid() else f"process {pid} on {host}"
    raise FileInUseError(f"{path} is being written by {where} (lock file {lock_path(path)}): give this run "
                         f"its own path, or close the monitor writing it (mon.remove()); delete the lock file "
                         f"only if no process writes there")


def check_free(path):
    """Raises FileInUseError if a live writer holds `path` (the sink's early check at construction)."""
    h = holder(path)
    if h is not None:
        _refuse(path, *h)


class Claim:
    """The lock of one file, held by this process until release() (or garbage collection of the claim)."""

    def __init__(self, path):
        self.path, self.lock = path, lock_path(path)
        self.lock.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"pid": os.getpid(), "host": socket.gethostname()})
        for _ in range(3):
            try:
                fd = os.open(self.lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                h = holder(path)
                if h is not None:
                    _refuse(path, *h)
                try:
                    self.lock.unlink()  # stale
                except FileNotFoundError:
                    pass
                continue
            with os.fdopen(fd, "w") as f:
                f.write(text)
            break
        else:
            _refuse(path, -1, "?")
        _held[self.lock] = self
        self._finalizer = weakref.finalize(self, _unlink, self.lock, text)

    def release(self):
        self._finalizer()


def _unlink(lock, text):
    try:
        if lock.read_text() == text:  # ours still: not taken over as stale meanwhile
            lock.unlink()
    except OSError:
        pass


class FileSink(Sink):
    """A sink writing a history file of its own at `path` (checked, and refused early when a live writer holds
    it): claim() takes this process's file (rank_path) on the first write; close() closes the subclass's files
    (close_files()) and releases it. resume(step): the file's lines of `step` and later (superseded(path) says
    which files and how to read a line's step) are dropped when the file is next opened (purge.py)."""

    def __init__(self, path):
        super().__init__()
        self.path = check_path(path, type(self).__name__)
        if not ranks.is_initialized():
            check_free(self.path)
        self._claim = self._purge_from = None
        self.run_id = None  # the run header's id: the monitor's (join_run), else the file's own

    def join_run(self, run_id):
        self.run_id = run_id

    def claim(self):
        """The path of this process's file, claimed on the first call (and purged after a resume())."""
        if self._claim is None:
            self._claim = Claim(rank_path(self.path))
        if self._purge_from is not None:
            for path, step_of in self.superseded(self._claim.path):
                drop_steps_from(path, self._purge_from, step_of)
            self._purge_from = None
        return self._claim.path

    def resume(self, step):
        self.close_files()
        self._purge_from = step

    def superseded(self, path):
        """[(file, step_of)] of what resume() purges for the claimed `path` (purge.drop_steps_from)."""
        return []

    def close_files(self):
        """Closes the files the subclass has open (the next write opens them again)."""

    def write_flight(self, flight):
        """flight_<step>.jsonl beside this process's file (flight_<step>.rank<r>.jsonl on a rank r > 0)."""
        from .flight_file import flight_path, write_flight_file
        path = self.claim()
        write_flight_file(flight_path(path.parent, flight, path.stem[len(self.path.stem):]), flight, self.run_id)

    def close(self):
        try:
            self.close_files()  # may raise (a full disk): the lock goes all the same
        finally:
            if self._claim is not None:
                self._claim.release()
                self._claim = None
