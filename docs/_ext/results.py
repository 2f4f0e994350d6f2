"""The `results` directive: a table from a JSON file a benchmark wrote under benchmarks/results/, so the
performance page shows the files' figures, never retyped ones.

    ```{results} step_floor_cnn.json
    :fields: step_ms ratio ratio_min ratio_max
    :rows: no hooks; hooks, op a no-op
    :labels: variant; ms a step; ratio; min; max
    ```

Every file has one shape (benchmarks/results_file.py writes it): {"machine", "torch", "commit", "command",
"results": {row: {field: value}}}. `:rows:` picks rows (all by default, in the file's order), `:labels:` names the
columns (the row column first; the field names by default). The command, commit, machine and torch version are
printed under the table. A missing file, key, row or field fails the build."""
import json
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import Directive, directives

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
ABOUT = ("command", "commit", "machine", "torch")


def cell(value):
    """Ratios to three decimals (1.000, 0.993), times and sizes to about four figures, tiny and huge ones in %g."""
    if isinstance(value, bool) or not isinstance(value, float):
        return "" if value is None else str(value)
    size = abs(value)
    if size >= 1e6 or 0 < size < 0.1:
        return f"{value:.3g}"
    return f"{value:.{1 if size >= 100 else 2 if size >= 10 else 3}f}"


class ResultsTable(Directive):
    required_arguments = 1
    option_spec = {"fields": directives.unchanged_required, "rows": directives.unchanged,
                   "labels": directives.unchanged}

    def run(self):
        path = RESULTS / self.arguments[0]
        if not path.is_file():
            raise self.error(f"no results file {path}")
        data = json.loads(path.read_text())
        results = data.get("results")
        if not isinstance(results, dict):
            raise self.error(f"{path.name} has no 'results' object")
        lacking = [k for k in ABOUT if not isinstance(data.get(k), str)]
        if lacking:
            raise self.error(f"{path.name} lacks {lacking} (benchmarks/results_file.py writes the shape)")
        fields = self.options["fields"].split()
        rows = self.options.get("rows")
        names = [r.strip() for r in rows.split(";")] if rows else list(results)
        for name in names:
            missing = [f for f in fields if name not in results or f not in results[name]]
            if missing:
                raise self.error(f"{path.name}: row {name!r} lacks {missing}")
        table = nodes.table()
        group = nodes.tgroup(cols=len(fields) + 1)
        table += group
        group.extend(nodes.colspec(colwidth=1) for _ in range(len(fields) + 1))
        head, body = nodes.thead(), nodes.tbody()
        group += head
        group += body
        labels = [t.strip() for t in self.options["labels"].split(";")] if "labels" in self.options else [""] + fields
        if len(labels) != len(fields) + 1:
            raise self.error(f"{len(labels)} labels for {len(fields)} fields and the row column")
        head += self.row(labels)
        for name in names:
            body += self.row([name] + [cell(results[name][f]) for f in fields])
        note = nodes.paragraph()
        note += nodes.Text(f"From benchmarks/results/{path.name}, commit {data['commit']}: ")
        note += nodes.literal(text=data["command"])
        note += nodes.Text(f". {data['machine']}; torch {data['torch']}.")
        return [table, note]

    @staticmethod
    def row(cells):
        row = nodes.row()
        for text in cells:
            entry = nodes.entry()
            entry += nodes.paragraph(text=text)
            row += entry
        return row


def setup(app):
    app.add_directive("results", ResultsTable)
    return {"parallel_read_safe": True}
