"""MemorySink: the last `max_steps` steps in memory, the source of Monitor.history(). Columnar: per target one
block of NumPy arrays with a row per step (scalars, the linear histogram, the log2 histogram's used slots),
about 0.7 KB a record instead of a dict of Python objects (~4.5 KB); the float buckets only on the rows that
have them (a flush's last step), as their nonzero slots; nbytes() is exactly what it holds.
History hands it a whole flush as arrays (write_steps: NumPy work per target, none per record)."""
import collections

import numpy as np

from .. import records, statistics
from ..config import check_count
from ..phases import Phase, record_phase
from .base import HIST_FIGURES, KEY_FIELDS, SCALARS, Sink, Steps

INTS, FLOATS, HISTS, (EDGES,) = (statistics.names(statistics.HISTORY, t) for t in
                                 (statistics.INT, statistics.FLOAT, statistics.COUNTS, statistics.EDGES))
FIELDS = (*INTS, *FLOATS, *HISTS, EDGES)
SPARSE = ("float_hist",)
LONG_COLUMNS = ("step", "target", "kind", "phase", "stat", "value")  # frame() / columns()  # histograms kept as (slots, counts) on the rows that have any


class _Sparse:
    """One histogram of a target kept only on the rows that have counts, each as its nonzero slots (int16)
    and their counts (int64): the float buckets (4096 slots, a few hundred used) come on histogram steps only."""

    def __init__(self, size, cap=0):
        self.size = size
        self.at = {}  # physical row -> (slots, counts)

    def arrays(self):
        return [a for pair in self.at.values() for a in pair]

    def resize(self, cap, order):
        self.at = {new: self.at[old] for new, old in enumerate(order.tolist()) if old in self.at}

    def put(self, at, h, used, has=None):
        """Histograms h [k, size] (None: none) into the physical rows `at`; has [k] bool: the rows that have
        one (None: all)."""
        rows = range(at.start, at.stop) if isinstance(at, slice) else at.tolist()
        for r, p in enumerate(rows):
            self.at.pop(p, None)
            if h is None or has is not None and not has[r]:
                continue
            slots = np.flatnonzero(h[r])
            self.at[p] = (slots.astype(np.int16), h[r, slots].astype(np.int64))

    def get(self, i):
        pair = self.at.get(i)
        if pair is None:
            return None
        h = np.zeros(self.size, dtype=np.int64)
        h[pair[0]] = pair[1]
        return h


class _Span:
    """One histogram of a target over its rows: slot 0 in a column of its own (exact zeros in the log2
    histogram, frequent after a ReLU) and of the others only slots lo..hi-1, the span the records have used
    so far (a few dozen of the log2 histogram's 256). Widened, with a copy, when a record reaches further.
    A row without this histogram (its record had None) holds -1 in slot 0 (counts are never negative) and
    get() gives None; so do the `cap` rows a block already has when the histogram first comes."""

    def __init__(self, size, cap=0):
        self.size, self.lo, self.hi = size, 1, 1
        self.first = np.full(cap, -1, dtype=np.int64)
        self.rows = np.zeros((cap, 0), dtype=np.int64)

    def arrays(self):
        return [self.first, self.rows]

    def resize(self, cap, order):
        """New capacity; `order` are the physical rows to keep, oldest first."""
        first, rows = np.zeros(cap, dtype=np.int64), np.zeros((cap, self.hi - self.lo), dtype=np.int64)
        first[: len(order)], rows[: len(order)] = self.first[order], self.rows[order]
        self.first, self.rows = first, rows

    def put(self, at, h, used, has=None):
        """Histograms h [k, size] (None: none) into the physical rows `at`; `used` (lo, hi): the span of
        slots 1.. that h uses, (0, 0) for none; has [k] bool: the rows that have one (None: all)."""
        if h is None:
            self.first[at], self.rows[at] = -1, 0
            return
        lo, hi = used
        if hi > lo and (lo < self.lo or hi > self.hi):
            if self.hi > self.lo:
                lo, hi = min(self.lo, lo), max(self.hi, hi)
            rows = np.zeros((len(self.rows), hi - lo), dtype=np.int64)
            rows[:, self.lo - lo: self.hi - lo] = self.rows
            self.rows, self.lo, self.hi = rows, lo, hi
        self.first[at] = h[:, 0] if has is None else np.where(has, h[:, 0], -1)
        self.rows[at] = h[:, self.lo: self.hi]

    def get(self, i):
        if self.first[i] < 0:
            return None
        h = np.zeros(self.size, dtype=np.int64)
        h[0] = self.first[i]
        h[self.lo: self.hi] = self.rows[i]
        return h


def spans_of(h, present=None):
    """(lo, hi) per target: the slots 1.. that its present rows use, (0, 0) for none. h [S, T, size] and
    present [S, T] (None: every row); or h [S, size], every row of one target: one pair."""
    if h.ndim == 2:
        return spans_of(h[:, None])[0]
    used = (h[..., 1:] if present is None or present.all() else h[..., 1:] * present[..., None]).any(axis=0)
    lo = used.argmax(axis=1) + 1
    hi = used.shape[1] + 1 - used[:, ::-1].argmax(axis=1)
    none = ~used.any(axis=1)
    lo[none], hi[none] = 0, 0
    return list(zip(lo.tolist(), hi.tolist()))


class _Schema:
    """Which fields a write's records have: ints and floats as columns, the other fields that are None, the
    histograms they carry (`counts`: None on some records or all of them, as a step without buckets has them)
    and the sizes of those given (`hists`), and the linear histogram's edges (one read-only array shared by
    the blocks)."""

    def __init__(self, cols):
        self.ints = tuple(k for k in INTS if cols.get(k) is not None)
        self.floats = tuple(k for k in FLOATS if cols.get(k) is not None)
        self.none = tuple(k for k in FIELDS if k in cols and cols[k] is None and k not in HISTS)
        self.counts = tuple(k for k in HISTS if k in cols)
        self.hists = tuple((k, cols[k].shape[-1]) for k in HISTS if cols.get(k) is not None)
        self.edges = None
        if cols.get(EDGES) is not None:
            self.edges = np.array(cols[EDGES], dtype=np.float64)
            self.edges.flags.writeable = False

    def fields(self):
        """What a target's records must keep from write to write (the histograms' sizes: _Block.check)."""
        return self.ints, self.floats, self.none, self.counts


def held_bytes(cols, targets, rows):
    """(fixed, widest): the bytes a MemorySink holds once each of `targets` targets keeps `rows` rows of
    records shaped like `cols` (a Steps' columns). fixed, exact: per row the step, the int and float
    scalars and slot 0 of each (dense) histogram, plus one hist_edges array (the targets of one write share
    it). widest, an upper bound: as if every histogram span covered all its other slots, every row had
    every float bucket, and every target had its own edges (targets first seen in different writes)."""
    if not targets or not rows:
        return 0, 0
    schema = _Schema(cols)
    dense = [(k, size) for k, size in schema.hists if k not in SPARSE]
    per_row = 8 * (1 + len(schema.ints) + len(schema.floats) + len(dense))
    edges = schema.edges.nbytes if schema.edges is not None else 0
    fixed = targets * rows * per_row + edges
    spans = targets * rows * 8 * sum(size - 1 for _, size in dense)
    sparse = targets * rows * (2 + 8) * sum(size for k, size in schema.hists if k in SPARSE)  # every slot of every row
    return fixed, fixed + spans + sparse + (targets - 1) * edges


class _Block:
    """The rows of one target: a ring of up to `max_rows` rows that doubles as it fills."""

    def __init__(self, key, schema, max_rows):
        self.key = dict(key)
        self.fields = schema.fields()
        self.ints, self.floats, self.none, self.counts = self.fields
        self.edges = schema.edges
        self.hists = {}  # the histograms given so far: earlier rows (and rows given None) have none
        self.max_rows, self.cap, self.n, self.start = max_rows, 0, 0, 0
        self.steps = np.zeros(0, dtype=np.int64)
        self.i = np.zeros((0, len(self.ints)), dtype=np.int64)
        self.f = np.zeros((0, len(self.floats)), dtype=np.float64)

    def arrays(self):
        return [self.steps, self.i, self.f, *(a for s in self.hists.values() for a in s.arrays())] + \
            ([self.edges] if self.edges is not None else [])

    def check(self, schema):
        """Raises if a write's records differ from this target's earlier ones in their fields or in a
        histogram's size (a histogram None before and given now, or the reverse, is no change)."""
        fields = schema.fields()
        sizes = {k: h.size for k, h in self.hists.items()}
        changed = [(k, sizes[k], size) for k, size in schema.hists if sizes.get(k, size) != size]
        if fields != self.fields:
            raise ValueError(f"the records of {self.key['target']!r} changed fields: {self.fields} -> {fields}")
        if changed:
            raise ValueError(f"the histograms of {self.key['target']!r} changed size (name, was, now): {changed}")

    def add_histograms(self, schema):
        """Storage for each histogram of a write given for the first time (the rows before have none)."""
        for k, size in schema.hists:
            if k not in self.hists:
                self.hists[k] = (_Sparse if k in SPARSE else _Span)(size, self.cap)

    def order(self):
        """Physical row indices, oldest first."""
        return (self.start + np.arange(self.n)) % max(self.cap, 1)

    def _grow(self, need):
        cap = max(8, self.cap)
        while cap < need:
            cap *= 2
        cap = cap if self.max_rows is None else min(cap, self.max_rows)
        order = self.order()
        for name in ("steps", "i", "f"):
            old = getattr(self, name)
            new = np.zeros((cap,) + old.shape[1:], dtype=old.dtype)
            new[: self.n] = old[order]
            setattr(self, name, new)
        for span in self.hists.values():
            span.resize(cap, order)
        self.cap, self.start = cap, 0

    def append(self, steps, ints, floats, hists):
        """Rows for `steps` (oldest first): ints [k, len(self.ints)], floats [k, len(self.floats)], hists
        {name: (h [k, size], span used, has: [k] bool rows that have it or None for all)}, those given
        (check() first); the rows of the others have none. When full at max_rows the oldest rows go."""
        k = len(steps)
        if self.max_rows is not None and k > self.max_rows:  # only the last max_rows can stay
            cut = slice(k - self.max_rows, k)
            steps, ints, floats = steps[cut], ints[cut], floats[cut]
            hists = {n: (None, None, None) if h is None else
                     (h[cut], None if n in SPARSE else spans_of(h[cut]), None if has is None else has[cut])
                     for n, (h, _, has) in hists.items()}
            k = self.max_rows
        if self.n + k > self.cap and (self.max_rows is None or self.cap < self.max_rows):
            self._grow(self.n + k)
        at = (self.start + self.n) % self.cap
        at = slice(at, at + k) if at + k <= self.cap else (at + np.arange(k)) % self.cap
        over = max(0, self.n + k - self.cap)
        self.n, self.start = self.n + k - over, (self.start + over) % self.cap
        self.steps[at] = steps
        self.i[at] = ints
        self.f[at] = floats
        for name, span in self.hists.items():
            span.put(at, *hists.get(name, (None, None, None)))

    def drop_from(self, first_step):
        """Forgets the rows of `first_step` and later (the newest: rows are kept in step order)."""
        keep = int((self.steps[self.order()] < first_step).sum())
        for p in self.order()[keep:].tolist():
            for span in self.hists.values():
                if isinstance(span, _Sparse):
                    span.at.pop(p, None)
        self.n = keep

    def rows_from(self, first_step):
        """Physical indices of the rows at or after `first_step`, oldest first."""
        order = self.order()
        return order[self.steps[order] >= first_step]

    def record(self, i):
        rec = dict(self.key)
        rec.update({k: None for k in self.none})
        rec.update({k: int(v) for k, v in zip(self.ints, self.i[i].tolist())})
        rec.update(zip(self.floats, self.f[i].tolist()))
        for k in self.counts:
            rec[k] = self.hists[k].get(i) if k in self.hists else None
        if self.edges is not None:
            rec[EDGES] = self.edges
        return records.record(rec)


def _histogram_row(name, records):
    """(h [1, T, size], missing [1, T] bool or None) of one histogram of a write's records, the None ones as
    zero rows marked missing; (None, None) when every one is None."""
    values = [r[name] for r in records]
    known = [np.asarray(v) for v in values if v is not None]
    if not known:
        return None, None
    if len({v.shape for v in known}) > 1:
        raise ValueError(f"the {name} of one write's records differ in size: {sorted({v.shape for v in known})}")
    zero = np.zeros_like(known[0])
    missing = np.array([[v is None for v in values]])
    return np.array([[zero if v is None else v for v in values]]), missing if missing.any() else None


def _key(record):
    """The KEY_FIELDS of a record (phase "train" where it has none)."""
    return {k: record.get(k, Phase.TRAIN) if k == "phase" else record[k] for k in KEY_FIELDS}


def _block_id(key):
    """A target's rows are kept per phase: its train steps and its validation passes apart."""
    return key["target"], record_phase(key)


class MemorySink(Sink):
    def __init__(self, max_steps=None):
        super().__init__()
        self.max_steps = max_steps = check_count("max_steps", max_steps, optional=True)
        self._window = collections.deque(maxlen=max_steps)  # the kept steps, oldest first (with max_steps)
        self._blocks = {}  # (target id, phase) -> _Block, in first-seen order
        self._writes = 0
        self.alerts = []

    def write(self, step, records):
        """One step's records, each kept as given: a histogram may be None on some records (a step without
        float buckets) or on every record of some writes and not of others."""
        first = records[0] if records else {}
        cols, missing = {}, {}
        for k in FIELDS:
            if k not in first:
                continue
            if k in HISTS:
                cols[k], missing[k] = _histogram_row(k, records)
            else:
                cols[k] = None if first[k] is None else (
                    first[k] if k == EDGES else np.array([[r[k] for r in records]]))
        self.write_steps(Steps([step], [_key(r) for r in records], cols, np.ones((1, len(records)), dtype=bool),
                               missing=missing))

    def write_steps(self, steps):
        """Many steps at once, as len(steps) write() calls, from the arrays of `steps` (a Steps; no record is
        built). A histogram's rows are None in the records where steps.missing[field] [S, T] is True, and all of
        them when its array is read-only (the zero rows of steps without float buckets: records.no_bucket_columns)."""
        keys, cols, present, missing = steps.keys, steps.columns, steps.present, steps.missing
        steps = np.asarray(steps.steps, dtype=np.int64)
        schema = _Schema(cols)
        hists = {k: (None, None) if not cols[k].flags.writeable else
                 (cols[k], None if missing.get(k) is None else ~np.asarray(missing[k], dtype=bool))
                 for k, _ in schema.hists}
        ints, floats = (np.stack([cols[k] for k in names], axis=-1) if names else np.zeros(present.shape + (0,), dtype)
                        for names, dtype in ((schema.ints, np.int64), (schema.floats, np.float64)))
        a = 0
        while a < len(steps):  # in runs that end where write() would drop the targets no kept step has
            b = len(steps) if self.max_steps is None else \
                min(len(steps), a + self.max_steps - self._writes % self.max_steps)
            self._append(steps[a:b], keys, schema, ints[a:b], floats[a:b],
                         {k: (h if h is None else h[a:b], has if has is None else has[a:b])
                          for k, (h, has) in hists.items()}, present[a:b])
            if self.max_steps is not None:
                self._window.extend(steps[a:b].tolist())
            self._writes += b - a
            if self.max_steps is not None and self._writes % self.max_steps == 0:
                first = self._window[0]
                self._blocks = {t: blk for t, blk in self._blocks.items()
                                if blk.n and blk.steps[blk.order()[-1]] >= first}
            a = b

    def _append(self, steps, keys, schema, ints, floats, hists, present):
        """hists {name: (h [S, T, size] or None for none, has [S, T] bool or None for all)}."""
        targets = np.flatnonzero(present.any(axis=0))
        firsts = present.argmax(axis=0).tolist()
        every = present.all(axis=0).tolist()
        spans = {k: None if k in SPARSE or h is None else spans_of(h, present) for k, (h, _) in hists.items()}
        order = sorted(targets.tolist(), key=lambda t: (firsts[t], t))  # new targets: in first-seen order
        for t in order:  # every target checked before any is written: a refused write changes nothing
            block = self._blocks.get(_block_id(keys[t]))
            if block is not None:
                block.check(schema)
        for t in order:
            block = self._blocks.get(_block_id(keys[t]))
            if block is None:
                block = self._blocks[_block_id(keys[t])] = _Block(_key(keys[t]), schema, self.max_steps)
            block.add_histograms(schema)
            rows = slice(None) if every[t] else np.flatnonzero(present[:, t])
            block.append(steps[rows], ints[rows, t], floats[rows, t],
                         {k: (None, None, None) if h is None else
                          (h[rows, t], spans[k] and spans[k][t], None if has is None else has[rows, t])
                          for k, (h, has) in hists.items()})

    def write_alerts(self, step, alerts):
        self.alerts.extend(alerts)

    def resume(self, step):
        """A rewind in this process (load_state_dict of an earlier checkpoint): the steps from `step` on are
        superseded, so each step is kept once, with the values of the run that goes on."""
        for block in self._blocks.values():
            block.drop_from(step)
        self._blocks = {t: b for t, b in self._blocks.items() if b.n}
        while self._window and self._window[-1] >= step:
            self._window.pop()

    def nbytes(self):
        """Bytes of the arrays held (the host side of the history)."""
        seen = {id(a): a.nbytes for b in self._blocks.values() for a in b.arrays()}
        return sum(seen.values())

    def _kept(self):
        """[(block, physical rows)] of the kept steps."""
        if self.max_steps is None:
            return [(b, b.order()) for b in self._blocks.values()]
        first = self._window[0] if self._window else None
        return [(b, b.rows_from(first)) for b in self._blocks.values()] if first is not None else []

    def items(self):
        """(step, record) pairs, oldest first; within a step, targets in first-seen order."""
        kept = self._kept()
        order = sorted((int(b.steps[i]), t, i) for t, (b, rows) in enumerate(kept) for i in rows.tolist())
        for step, t, i in order:
            yield step, kept[t][0].record(i)

    @property
    def steps(self):
        """[(step, records)] of the kept steps, oldest first."""
        out = {}
        for step, rec in self.items():
            out.setdefault(step, []).append(rec)
        return list(out.items())

    def _long(self):
        """The long table as arrays (step, target, kind, phase, stat, value, is_int), by step, target (train before
        eval), stat."""
        parts = []
        for t, (b, rows) in enumerate(self._kept()):
            if not len(rows):
                continue
            for s, stat in enumerate(SCALARS):
                if stat in b.ints:
                    vals, is_int = b.i[rows, b.ints.index(stat)].astype(np.float64), True
                elif stat in b.floats:
                    vals, is_int = b.f[rows, b.floats.index(stat)], False
                else:
                    continue
                steps = b.steps[rows]
                if stat in HIST_FIGURES:  # rows whose histograms were not counted have no such figure, not NaN
                    keep = ~np.isnan(vals)
                    steps, vals = steps[keep], vals[keep]
                parts.append((steps, t, b.key["target"], b.key["kind"], s, stat, vals, is_int,
                              b.key["phase"]))
        parts = [p for p in parts if len(p[0])]
        if not parts:
            return None
        step = np.concatenate([p[0] for p in parts])
        t_ix = np.concatenate([np.full(len(p[0]), p[1]) for p in parts])
        s_ix = np.concatenate([np.full(len(p[0]), p[4]) for p in parts])
        order = np.lexsort((s_ix, t_ix, step))

        def col(i):
            return np.concatenate([np.full(len(p[0]), p[i], dtype=object) for p in parts])[order]
        return (step[order], col(2), col(3), col(8), col(5), np.concatenate([p[6] for p in parts])[order],
                np.concatenate([np.full(len(p[0]), p[7]) for p in parts])[order])

    def columns(self):
        """The long table as plain lists: {"step": [...], "target": [...], "kind", "phase", "stat", "value"}."""
        long = self._long()
        if long is None:
            return {k: [] for k in LONG_COLUMNS}
        step, target, kind, phase, stat, value, is_int = long
        return {"step": step.tolist(), "target": target.tolist(), "kind": kind.tolist(), "phase": phase.tolist(),
                "stat": stat.tolist(), "value": [int(v) if i else v for v, i in zip(value.tolist(), is_int.tolist())]}

    def frame(self):
        """A pandas DataFrame of the long table when pandas is installed, else columns()."""
        try:
            import pandas as pd
        except ImportError:
            return self.columns()
        long = self._long()
        if long is None:
            return pd.DataFrame(self.columns())
        return pd.DataFrame(dict(zip(LONG_COLUMNS, long[:6])))
