"""The `results` directive: a table from a JSON file a benchmark wrote under benchmarks/results/, so the
performance page shows the files' figures, never retyped ones.

    ```{results} step_floor_cnn.json
    :fields: step_ms ratio ratio_min ratio_max
    ```

The file holds {"results": {row: {field: value}}, ...}; its other top-level scalars (command, commit, machine,
torch, date, rounds) are printed under the table. A missing file or field fails the build."""
import json
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import Directive, directives

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
ABOUT = ("command", "commit", "machine", "device", "torch", "threads", "rounds", "date")


def cell(value):
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


class ResultsTable(Directive):
    required_arguments = 1
    option_spec = {"fields": directives.unchanged_required, "rows": directives.unchanged}

    def run(self):
        path = RESULTS / self.arguments[0]
        if not path.is_file():
            raise self.error(f"no results file {path}")
        data = json.loads(path.read_text())
        results = data.get("results")
        if not isinstance(results, dict):
            raise self.error(f"{path.name} has no 'results' object")
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
        head += self.row([""] + fields)
        for name in names:
            body += self.row([name] + [cell(results[name][f]) for f in fields])
        about = "; ".join(f"{k}: {cell(data[k])}" for k in ABOUT if k in data)
        note = nodes.paragraph(text=f"From benchmarks/results/{path.name}" + (f" ({about})" if about else ""))
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
