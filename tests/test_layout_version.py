"""Saved slots carry their state layout: a JSONL history's run header and a checkpoint name rawstate.LAYOUT; a file
or checkpoint written with another layout is not read against today's slots (a JSONL run loses its slots with one
LayoutWarning, a checkpoint is refused), and one saved before layouts were named reads as before."""
import json
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import hookstats
from hookstats import rawstate
from hookstats.sinks import JSONLSink, LayoutWarning, read_jsonl

OTHER = {**rawstate.LAYOUT, "version": rawstate.LAYOUT_VERSION + 1}


def trained(sinks=()):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 2))
    mon = hookstats.attach(model, sinks=list(sinks), log_every=2)
    for _ in range(4):
        model(torch.randn(8, 6)).pow(2).sum().backward()
    return model, mon


def rewrite_header(src, dst, change):
    """`src`'s lines with each run header passed through change(header) (None: the header left out)."""
    out = []
    for line in src.read_text().splitlines():
        obj = json.loads(line)
        if obj["type"] == "run":
            obj = change(obj)
            if obj is None:
                continue
        out.append(json.dumps(obj))
    dst.write_text("\n".join(out) + "\n")


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    path = tmp_path_factory.mktemp("layout") / "h.jsonl"
    _, mon = trained([JSONLSink(path)])
    mon.remove()
    return path


def test_the_run_header_names_the_layout(history):
    headers = [json.loads(line) for line in history.read_text().splitlines() if '"type": "run"' in line]
    assert [h["layout"] for h in headers] == [rawstate.LAYOUT]
    assert rawstate.LAYOUT == {"version": rawstate.LAYOUT_VERSION, "float_slots": rawstate.FLOAT_SLOTS,
                               "log_slots": rawstate.LOG_SLOTS}


def test_a_run_of_another_layout_reads_without_its_slots(history, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mine, _ = read_jsonl(history)
    assert any(r.get("float_hist") is not None for _, r in mine) and any(r.get("log2_hist") is not None for _, r in mine)
    other = tmp_path / "other.jsonl"
    rewrite_header(history, other, lambda h: {**h, "layout": OTHER})
    with pytest.warns(LayoutWarning) as caught:
        theirs, _ = read_jsonl(other)
    messages = [str(w.message) for w in caught if issubclass(w.category, LayoutWarning)]
    assert len(messages) == 1 and "\n" not in messages[0]
    assert f"state layout {OTHER['version']} " in messages[0] and "left out" in messages[0]
    assert [(s, r["target"]) for s, r in theirs] == [(s, r["target"]) for s, r in mine]
    for (_, a), (_, b) in zip(mine, theirs):
        assert b.get("float_hist") is None and b.get("log2_hist") is None
        assert {k: v for k, v in a.items() if not isinstance(v, np.ndarray) and v is not None and v == v} \
            .items() <= b.items()


def test_a_run_saved_without_a_layout_reads_its_slots(history, tmp_path):
    """Files of versions that named no layout were written with layout 1."""
    old = tmp_path / "old.jsonl"
    rewrite_header(history, old, lambda h: {k: v for k, v in h.items() if k != "layout"})
    headless = tmp_path / "headless.jsonl"
    rewrite_header(history, headless, lambda h: None)
    mine, _ = read_jsonl(history)
    for path in (old, headless):
        with warnings.catch_warnings():
            warnings.simplefilter("error", LayoutWarning)
            items, _ = read_jsonl(path)
        for (_, a), (_, b) in zip(mine, items):
            for k in ("float_hist", "log2_hist"):
                assert (a.get(k) is None) == (b.get(k) is None)
                if a.get(k) is not None:
                    np.testing.assert_array_equal(a[k], b[k])


def test_a_checkpoint_names_its_layout_and_another_is_refused(tmp_path):
    model, mon = trained()
    sd = mon.state_dict()
    assert sd["layout"] == rawstate.LAYOUT
    torch.save(sd, tmp_path / "ck.pt")
    sd = torch.load(tmp_path / "ck.pt", weights_only=True)
    before = mon.stats()
    with pytest.raises(ValueError, match=f"state layout {OTHER['version']} .*this version of hookstats reads layout "
                                         f"{rawstate.LAYOUT_VERSION} ") as e:
        mon.load_state_dict({**sd, "layout": OTHER})
    assert "\n" not in str(e.value)
    assert mon.stats()["0:output"]["count"] == before["0:output"]["count"]
    mon.reset()
    mon.load_state_dict({k: v for k, v in sd.items() if k != "layout"})  # saved before layouts were named
    assert mon.stats()["0:output"]["count"] == before["0:output"]["count"]
    mon.remove()
