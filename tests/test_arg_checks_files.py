"""Arguments of the file sinks, TensorBoardSink and the command line checked where they are given: one clear
error naming the argument, never a failure later or a traceback."""
import json

import pytest

from hookstats.sinks import CSVSink, JSONLSink, TensorBoardSink


@pytest.mark.parametrize("sink", [CSVSink, JSONLSink])
@pytest.mark.parametrize("bad", [None, 5, b"x.csv", "", "  ", ["a"]])
def test_file_sinks_check_their_path_at_construction(sink, bad):
    with pytest.raises(ValueError, match=f"{sink.__name__}: path must be a file path"):
        sink(bad)


@pytest.mark.parametrize("writer, missing", [(5, "add_scalar, add_text, flush, add_histogram_raw"),
                                             (object(), "add_scalar"), ("runs/x", "add_scalar")])
def test_tensorboard_sink_checks_the_writer_at_construction(writer, missing):
    with pytest.raises(ValueError, match=f"TensorBoardSink: writer must be a SummaryWriter .* without {missing}"):
        TensorBoardSink(writer=writer)


def test_tensorboard_sink_takes_a_writer_without_histograms_when_none_are_asked_for():
    class Scalars:
        def __init__(self):
            self.got = []

        def add_scalar(self, tag, v, step):
            self.got.append((tag, v, step))

        def add_text(self, *a):
            pass

        def flush(self):
            pass

    w = Scalars()
    with pytest.raises(ValueError, match="without add_histogram_raw"):
        TensorBoardSink(writer=w)
    sink = TensorBoardSink(writer=w, histograms=False, stats=("mean",))
    sink.write(3, [{"target": "a:output", "mean": 1.5}])
    assert w.got == [("hookstats/a/output/mean", 1.5, 3)]


@pytest.mark.parametrize("bad", [5, b"runs", ""])
def test_tensorboard_sink_checks_log_dir(bad):
    with pytest.raises(ValueError, match="TensorBoardSink: log_dir must be a folder path"):
        TensorBoardSink(bad)


def plan_error(capsys, *argv):
    from hookstats.tools.planner import main
    code = main(list(argv))
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


@pytest.mark.parametrize("flag", ["--batch", "--seq"])
def test_plan_sizes_beyond_what_a_tensor_holds_are_one_error(capsys, flag):
    pytest.importorskip("transformers")
    with pytest.raises(SystemExit) as e:
        plan_error(capsys, "gpt2", flag, "99999999999999999999")
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err == [f"hookstats plan: error: argument {flag}: must be <= 2147483647, got "
                                         "99999999999999999999"]


@pytest.mark.parametrize("field, value", [("n_layer", "x"), ("n_embd", 64.5), ("vocab_size", [100]),
                                          ("n_head", None)])
def test_plan_config_field_of_the_wrong_type_is_one_error(tmp_path, capsys, field, value):
    pytest.importorskip("transformers")
    cfg = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 100, "n_positions": 64}
    cfg[field] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    code, err = plan_error(capsys, str(path), "--seq", "8")
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"hookstats plan: error: {path}: transformers cannot build") and "Traceback" not in err[0]
