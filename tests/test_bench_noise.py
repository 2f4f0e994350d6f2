"""`hookstats bench` on a fake timing source: a ratio whose spread reaches 1 (or below: hookstats adds work) is
"within noise", never printed as hookstats being faster than no hooks; a clear overhead keeps its ratio."""
import json

import pytest
from torch import nn

from hookstats.tools.bench import command, timing
from hookstats.tools.bench.variants import Installed


@pytest.fixture
def fake_runs(monkeypatch):
    """Every timed step costs 100 ms with no hooks and 100 ms x the next scripted ratio with hookstats,
    on a fake clock; the baseline drifts by +-3 % from round to round."""
    now, cost, rounds = [0.0], [0.1], {"hookstats": 0, "no hooks": 0}
    script = {}

    def fake_workload(name, device="cpu"):
        def step():
            now[0] += cost[0]
        return nn.Linear(2, 2), step

    def install(label):
        def inst(model):
            drift = (1.0, 1.03, 0.97)[min(rounds.values()) % 3]  # the round both runs belong to
            cost[0] = 0.1 * drift * (script["ratios"][rounds["hookstats"]] if label == "hookstats" else 1.0)
            rounds[label] += 1
            return Installed()
        return inst

    monkeypatch.setitem(timing.CLOCKS, "wall", lambda: now[0])
    monkeypatch.setattr(timing, "make_workload", fake_workload)
    monkeypatch.setitem(timing.VARIANTS, "hookstats", install("hookstats"))
    monkeypatch.setitem(timing.VARIANTS, "no hooks", install("no hooks"))
    monkeypatch.setattr(command, "count_syncs", lambda w, v: (0.0, []))

    def run(ratios, capsys, tmp_path):
        script["ratios"] = ratios
        out = tmp_path / "bench.json"
        code = command.main(["--workloads", "stack1", "--variants", "hookstats", "--repeats", str(len(ratios)),
                             "--memory-steps", "0", "--no-progress", "--json", str(out)])
        assert code == 0
        row = json.loads(out.read_text())["workloads"]["stack1"]["hookstats"]
        line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("hookstats "))
        return row, line
    return run


@pytest.mark.parametrize("ratios", [[0.983, 0.97, 1.01], [0.98, 0.985, 0.99], [0.99, 1.004, 1.0, 0.97, 1.02]],
                         ids=["straddles-1", "all-below-1", "five-repeats"])
def test_a_ratio_within_noise_is_said_so_never_printed_as_a_speedup(fake_runs, capsys, tmp_path, ratios):
    row, line = fake_runs(ratios, capsys, tmp_path)
    assert row["within_noise"] and row["ratio_q1"] <= 1.0
    assert "within noise" in line
    assert f"{row['ratio']:.3f}x" not in line


def test_fewer_than_three_repeats_give_no_spread_and_are_within_noise(fake_runs, capsys, tmp_path):
    row, line = fake_runs([1.3], capsys, tmp_path)
    assert row["within_noise"] and "within noise (1 repeat)" in line


def test_a_clear_overhead_is_printed_with_its_interquartile_range(fake_runs, capsys, tmp_path):
    row, line = fake_runs([1.2, 1.25, 1.22, 1.21], capsys, tmp_path)
    assert not row["within_noise"]
    assert row["ratio"] == pytest.approx(1.215, abs=1e-9)
    assert (row["ratio_q1"], row["ratio_q3"]) == pytest.approx((1.2075, 1.2275), abs=1e-9)
    assert f"1.215x [1.208..{row['ratio_q3']:.3f}]" in line and "within noise" not in line


def test_bench_help_says_how_long_the_default_run_takes(capsys):
    with pytest.raises(SystemExit):
        command.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "The default run" in text and "takes about 30 minutes" in text
