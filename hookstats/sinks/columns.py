"""A history read back as columns, for `hookstats report`: one row per record a reader kept (runs.Ledger's order: by
step, then as written), each row's step and its target (labelled by phase, phases.phase_label) and kind as NumPy
codes, and the statistics the charts plot as float64 arrays; a row's whole record is built only when asked
(record(i)), so a history of 20,000 targets costs a few records per target, not one dict per line. The JSONL
reader fills it straight from the file's lines (jsonl.read_jsonl_columns); from_items() takes (step, record) pairs
(a CSV file's, a MemorySink's)."""
import numpy as np

from .. import statistics
from ..phases import phase_label, record_phase
from ..record_reading import has_buckets, record

# the statistics kept as arrays: the plotted ones, and what the gradient norms are made of
NUMERIC = tuple(dict.fromkeys([st.name for st in statistics.PLOTTED] + ["l2", "nan", "posinf", "neginf"]))
HISTOGRAMS = ("hist", "log2_hist", "float_hist")


class Columns:
    """steps [N] int64; label [N] (codes into labels: each target by phase), kind [N] (codes into kinds);
    numeric {statistic: [N] float64, NaN where a record has none}; build(i) -> row i's record, built[i] its
    record where it is made already (rows with histograms or odd fields, rows asked for), has_hist [N] whether row i's
    record may hold a histogram; histograms(i) -> row i's {histogram: counts or None} without its record, or None
    where the reader cannot tell them apart from the record (then its record is built)."""

    def __init__(self, steps, label, labels, kind, kinds, numeric, build, built, has_hist, histograms=None):
        self.steps, self.label, self.labels, self.kind, self.kinds = steps, label, labels, kind, kinds
        self.numeric, self._build, self.built, self.has_hist = numeric, build, built, has_hist
        self._histograms = histograms
        self._by_label = None

    def __len__(self):
        return len(self.steps)

    def record(self, i):
        """Row i's record, as the reader's (step, record) pairs hold it (built once)."""
        rec = self.built.get(i)
        if rec is None:
            rec = self.built[i] = self._build(i)
        return rec

    def histograms(self, i):
        """{"hist", "log2_hist", "float_hist": row i's counts or None}, as its record holds them: what the charts
        read of every row with histograms, so a row whose record is not made yet is not made for them."""
        if i not in self.built and self._histograms is not None:
            got = self._histograms(i)
            if got is not None:
                return got
        rec = self.record(i)
        return {h: rec.get(h) for h in HISTOGRAMS}

    def items(self):
        """(step, record) pairs of every row: what read_jsonl() returns."""
        return [(int(s), self.record(i)) for i, s in enumerate(self.steps.tolist())]

    def rows_by_label(self):
        """[row indices of each label] in labels' order, each in row order (by step)."""
        if self._by_label is None:
            order = np.argsort(self.label, kind="stable")
            cuts = np.cumsum(np.bincount(self.label, minlength=len(self.labels)))[:-1]
            self._by_label = np.split(order, cuts)
        return self._by_label

    def last_records(self, bucket_figures=()):
        """record_reading.last_records() of these rows: per label its last row's record, the `bucket_figures` from
        its last row with float buckets; and whether any had them."""
        out, any_buckets = [], False
        for t, rows in zip(self.labels, self.rows_by_label()):
            if not len(rows):
                continue
            rec = self.record(int(rows[-1]))
            figures = {}
            for i in reversed(rows[self.has_hist[rows]].tolist()):
                r = self.record(i)
                if has_buckets(r):
                    figures, any_buckets = {k: r.get(k) for k in bucket_figures}, True
                    break
            out.append(record(rec, target=t, **figures))
        return out, any_buckets

    def items_of_kind(self, kind):
        """(step, record) pairs of the rows of one kind."""
        if kind not in self.kinds:
            return []
        rows = np.flatnonzero(self.kind == self.kinds.index(kind))
        return [(int(self.steps[i]), self.record(int(i))) for i in rows]

    @classmethod
    def from_items(cls, items):
        """Columns of (step, record) pairs, each record given."""
        items = list(items)
        labels, kinds = {}, {}
        label = np.array([labels.setdefault(phase_label(r["target"], record_phase(r)), len(labels))
                          for _, r in items], dtype=np.int64)
        kind = np.array([kinds.setdefault(r.get("kind", ""), len(kinds)) for _, r in items], dtype=np.int64)
        numeric = {k: np.array([np.nan if r.get(k) is None else float(r[k]) for _, r in items], dtype=np.float64)
                   for k in NUMERIC}
        has_hist = np.array([any(r.get(h) is not None for h in HISTOGRAMS) for _, r in items], dtype=bool)
        return cls(np.array([s for s, _ in items], dtype=np.int64), label, list(labels), kind, list(kinds), numeric,
                   None, {i: r for i, (_, r) in enumerate(items)}, has_hist)
