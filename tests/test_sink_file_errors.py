"""A file sink whose path cannot be a file, and one dropped mid-run for a full disk: one clear line, and the
dropped sink's file closed and its lock released."""
import errno
import warnings

import pytest
import torch

import hookstats
from hookstats.sinks import CSVSink, JSONLSink


@pytest.mark.parametrize("cls, name", [(JSONLSink, "history.jsonl"), (CSVSink, "history.csv")])
def test_a_path_under_a_file_is_one_line_naming_the_file(tmp_path, cls, name):
    (tmp_path / "plain").write_text("x")
    with pytest.raises(ValueError) as e:
        cls(tmp_path / "plain" / "x" / name)
    msg = str(e.value)
    assert "\n" not in msg and str(tmp_path / "plain") in msg and "not a folder" in msg and "process" not in msg


class _Disk:
    """A file whose writes fail with ENOSPC once `full` is set."""

    def __init__(self, f, full):
        self.f, self.full = f, full

    def write(self, text):
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.f.write(text)

    def __getattr__(self, name):
        return getattr(self.f, name)


def test_a_sink_dropped_for_a_full_disk_closes_its_file(tmp_path, monkeypatch):
    import hookstats.sinks.jsonl as jsonl
    opened, full = [], []
    real_open = jsonl.open_parent
    monkeypatch.setattr(jsonl, "open_parent", lambda path, mode: opened.append(real_open(path, mode)) or
                        _Disk(opened[-1], full))
    model = torch.nn.Linear(3, 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with hookstats.attach(model, sinks=[JSONLSink(tmp_path / "h.jsonl")], steps="manual", log_every=1) as mon:
            model(torch.ones(2, 3))
            mon.step()
            full.append(True)
            model(torch.ones(2, 3))
            mon.step()
            assert any("dropped" in str(w.message) for w in caught)
            assert len(opened) == 1 and opened[0].closed and not (tmp_path / "h.jsonl.lock").exists()
