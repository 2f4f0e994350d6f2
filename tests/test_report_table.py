"""`hookstats report`'s table of each target's last step: printed whole up to 40 rows, past that its first and
last 15 rows and where the whole table is; the file beside the charts always holds every row. The oracle is the
history the test writes by hand (one record per target, its mean the target's number)."""
import json

import pytest

from hookstats.tools import cli


def hand_written_run(run, n):
    run.mkdir()
    lines = [{"type": "stats", "step": 0, "target": f"t{i:03d}:output", "module": f"t{i:03d}", "kind": "output",
              "leaf": "", "phase": "train", "count": 4, "mean": float(i), "std": 1.0} for i in range(n)]
    lines.append({"type": "step_end", "step": 0, "targets": n})
    (run / "history.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return [f"t{i:03d}:output" for i in range(n)]


def rows_of(text):
    """{target: its mean's cell} of the table's rows in `text` (a row starts with a target name)."""
    return {ln.split()[0]: ln.split()[2] for ln in text.splitlines() if ln.startswith("t") and ":output " in ln}


@pytest.mark.parametrize("n, printed", [(40, range(40)), (41, [*range(15), *range(26, 41)]),
                                        (200, [*range(15), *range(185, 200)])])
def test_a_long_table_prints_its_ends_and_the_file_holds_every_row(tmp_path, capsys, n, printed):
    targets = hand_written_run(tmp_path / "run", n)
    assert cli.main(["report", str(tmp_path / "run"), "--out", str(tmp_path / "charts"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    whole = tmp_path / "charts" / "last_step_table.txt"
    assert list(rows_of(out)) == [targets[i] for i in printed]
    assert list(rows_of(whole.read_text())) == targets
    assert all(rows_of(whole.read_text())[t] == str(i) for i, t in enumerate(targets))
    cut = [ln for ln in out.splitlines() if ln.startswith("...")]
    if len(printed) == n:
        assert not cut
    else:
        assert cut == [f"... {n - 30:,} of {n:,} rows left out here; the whole table is in {whole}"]
