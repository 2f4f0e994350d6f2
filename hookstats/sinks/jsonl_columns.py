"""The records of a JSONL history (scalars, log2 histograms and float buckets: every line but a fixed-range
histogram's) read as columns: each line's values kept as they came from json.loads, grouped by the line's field
names, then each field checked over all of a group's lines at once with jsonl._record()'s rules (a step in
0..2^63-1, names and the kind/phase vocabulary once per distinct value, floats or null, counts within 2^53 or null,
histogram slots {slot: count} with slots in range and counts within int64, made dense in one array per group). A
line that any check flags is read by _record() itself, so it is kept or skipped, with the same note, exactly as a
line read alone."""
import itertools

import numpy as np

from .. import layout
from ..phases import Phase, phase_label
from . import fields
from .columns import HISTOGRAMS, NUMERIC, Columns

_KEYS = ("target", "module", "kind", "leaf", "phase")
_NOT_PLAIN = frozenset({"hist", "hist_range"})  # a fixed-range histogram: read one line at a time
_SLOTS = {"log2_hist": layout.LOG_SLOTS, "float_hist": layout.FLOAT_SLOTS}
_NONE = type(None)


class _Group:
    """Lines with the same field names, in file order: their values (tuples) and line numbers."""

    def __init__(self, keys, checks):
        self.keys, self.checks = keys, checks
        self.rows, self.lines, self.places, self.built, self.dropped, self.numeric = [], [], [], {}, set(), {}
        self.ok = self.step = self.target = self.phase = self.kind = None
        self.slots = {}  # histogram field -> _Slots

    def slots_of(self, r):
        """{histogram field: line r's dense counts} of the fields line r holds as slots (not null)."""
        return {k: sl.dense(r) for k, sl in self.slots.items() if sl.has[r]}


def _checks(keys, plan):
    """{field: "float" | "count" | "scalar" (a count kept as a float)} of a plain group's statistics, or None where the lines are not plain (no step or
    target, a histogram, a field _record() reads another way)."""
    if "step" not in keys or "target" not in keys or _NOT_PLAIN.intersection(keys):
        return None
    out = {}
    for k, how in plan(keys):
        if k in _KEYS:
            continue
        if how not in ("float", "count", "scalar"):
            return None
        out[k] = how
    return out


class PlainLines:
    """take() each stats line in file order; check() once the file is read, then columns()."""

    def __init__(self, plan, ledger):
        self.plan, self.ledger, self.groups = plan, ledger, {}

    def take(self, n, obj):
        """Keeps line n's values, and its place among the file's records, when its record is plain (True); False:
        read it as one record."""
        keys = tuple(obj)
        g = self.groups.get(keys)
        if g is None:
            g = self.groups[keys] = _Group(keys, _checks(keys, self.plan))
        if g.checks is None:
            return False
        g.rows.append(tuple(obj.values()))
        g.lines.append(n)
        g.places.append(self.ledger.place())
        return True

    def check(self, read_one, lines, names):
        """Checks every group's lines; read_one(obj) -> (step, record) (jsonl._record) reads a flagged one. Returns
        (notes [(line, why)] of the lines skipped, how many were read)."""
        notes, read = [], 0
        for g in self.groups.values():
            if g.checks is None or not g.rows:
                continue
            cols = dict(zip(g.keys, zip(*g.rows)))
            ok = np.ones(len(g.rows), dtype=bool)
            for k, col in cols.items():
                if k == "step":
                    ok &= _steps_ok(col)
                elif k in _KEYS:
                    ok &= _names_ok(k, col, lines, names)
                elif k in _SLOTS:
                    g.slots[k] = _slots(col, _SLOTS[k], none_ok=k == "log2_hist")
                    ok &= g.slots[k].ok
                elif k in g.checks:
                    ok &= _CHECK[g.checks[k]](col)
            for r in np.flatnonzero(~ok).tolist():
                try:
                    g.built[r] = read_one(dict(zip(g.keys, g.rows[r])))
                except ValueError as e:
                    notes.append((g.lines[r], str(e)))
                    g.dropped.add(r)
            read += len(g.rows) - len(g.dropped)
            g.ok = np.flatnonzero(ok)
            every = ok.all()

            def column(k, default=None):
                col = cols.get(k)
                if col is None:
                    return [default] * len(g.ok)
                return list(col) if every else [col[r] for r in g.ok.tolist()]
            g.step = np.array(column("step"), dtype=np.int64)
            g.target = [names[("target", v)] for v in column("target")]
            g.phase = column("phase", Phase.TRAIN)
            g.kind = [names[("kind", v)] for v in column("kind")] if "kind" in cols else [""] * len(g.ok)
            for k in NUMERIC:
                if k in cols:
                    g.numeric[k] = np.array(column(k), dtype=np.float64)
        return notes, read

    def columns(self, build):
        """The history's Columns: the records the ledger holds and the checked plain lines, resolved (runs.Ledger);
        build(obj, slots) -> the record of a plain line's values, its histograms' dense counts given."""
        ledger, keys = self.ledger, {}
        # the records read one each first (the ledger's, then the flagged plain lines), then each group's plain lines
        entries = [(r, st, tp, rec, p) for r, st, tp, rec, p in ledger.entries]
        for g in self.groups.values():
            entries += [(g.places[r][0], st, (rec["target"], rec["phase"]), rec, g.places[r][1])
                        for r, (st, rec) in g.built.items()]
        run = [e[0] for e in entries]
        step = [e[1] for e in entries]
        key = [keys.setdefault(e[2], len(keys)) for e in entries]
        pos = [e[4] for e in entries]
        source = [e[3] for e in entries]
        n_built = len(source)
        parts = []  # per group of plain lines: (run, step, key, pos) arrays
        plain = [g for g in self.groups.values() if g.ok is not None and len(g.ok)]
        for g in plain:
            places = np.array(g.places, dtype=np.int64).reshape(-1, 2)[g.ok]
            parts.append((places[:, 0], g.step, np.array([keys.setdefault(tp, len(keys)) for tp in
                                                           zip(g.target, g.phase)], dtype=np.int64), places[:, 1]))
        cat = [np.concatenate([np.array(a, dtype=np.int64)] + [p[j] for p in parts]) for j, a in
               enumerate((run, step, key, pos))]
        won = ledger.resolve(*cat, stacklevel=4)
        group_of = np.concatenate([np.full(n_built, -1)] + [np.full(len(g.ok), j) for j, g in enumerate(plain)])
        row_of = np.concatenate([np.arange(n_built)] + [g.ok for g in plain]).astype(np.int64)
        at = np.concatenate([np.zeros(n_built, np.int64)] + [np.arange(len(g.ok)) for g in plain]).astype(np.int64)
        n = len(won)
        steps = cat[1][won]
        names = {code: tp for tp, code in keys.items()}
        kind_of = [source[i].get("kind", "") for i in range(n_built)] + [k for g in plain for k in g.kind]
        labels, kinds, label_code = {}, {}, {}
        label, kind = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
        for i, (e, k) in enumerate(zip(won.tolist(), cat[2][won].tolist())):
            code = label_code.get(k)
            if code is None:
                code = label_code[k] = labels.setdefault(phase_label(*names[k]), len(labels))
            label[i] = code
            kind[i] = kinds.setdefault(kind_of[e], len(kinds))
        numeric = {k: np.full(n, np.nan) for k in NUMERIC}
        has_hist = np.zeros(n, dtype=bool)  # the plain lines': set below for a group with histograms
        built = {}
        gw = group_of[won]
        for i in np.flatnonzero(gw < 0).tolist():
            rec = source[won[i]]
            built[i] = rec
            has_hist[i] = any(rec.get(h) is not None for h in HISTOGRAMS)
            for k in NUMERIC:
                v = rec.get(k)
                numeric[k][i] = np.nan if v is None else float(v)
        for j, g in enumerate(plain):
            dst = np.flatnonzero(gw == j)
            src = at[won[dst]]
            for k, v in g.numeric.items():
                numeric[k][dst] = v[src]
            if g.slots:
                has_hist[dst] = True
        rows_of = row_of[won]

        def record(i):
            g, r = plain[gw[i]], rows_of[i]
            return build(dict(zip(g.keys, g.rows[r])), g.slots_of(r))

        def histograms(i):
            g = plain[gw[i]] if gw[i] >= 0 else None
            if g is None or "float_hist" in g.slots and "log2_hist" not in g.slots:
                return None  # a record read alone; log2 slots summed from the float buckets (record_reading.record)
            return {**dict.fromkeys(HISTOGRAMS), **g.slots_of(rows_of[i])}
        return Columns(steps, label, list(labels), kind, list(kinds), numeric, record, built, has_hist, histograms)


def _types(col):
    return set(map(type, col))


def _steps_ok(col):
    if _types(col) == {int}:
        try:
            return np.array(col, dtype=np.int64) >= 0
        except OverflowError:
            pass
    return np.fromiter((type(v) is int and 0 <= v <= fields.INT64_MAX for v in col), bool, len(col))


def _names_ok(k, col, lines, names):
    """Whether each value is a valid `k` (fields.key), each distinct value checked once (names: the file's
    {(field, value): checked value}, shared with jsonl._record)."""
    try:
        distinct = set(col)
    except TypeError:  # a list or object: read one by one
        return False
    badset = set()
    for v in distinct:
        if type(v) is str and (k, v) in names:
            continue
        try:
            got = fields.key(v, k, lines)
        except ValueError:
            badset.add(v)
            continue
        if type(v) is str:
            names[(k, v)] = got
    if not badset:
        return True
    return np.fromiter((v not in badset for v in col), bool, len(col))


def _floats_ok(col):
    if _types(col) <= {float, _NONE}:
        return True
    return np.fromiter((type(v) is float or v is None for v in col), bool, len(col))


class _Slots:
    """A group's histogram field checked: ok [n] lines, has [n] whether a line holds a dict, and the slots and counts
    of all the dicts, in line order (`at` [lines with a dict + 1]: where each line's begin); dense(r) makes line r's
    counts dense when asked (one array a line: a block of all of them would be faulted in page by page twice)."""

    def __init__(self, size, ok, has, at, slot, count):
        self.size, self.ok, self.has, self.at, self.slot, self.count = size, ok, has, at, slot, count
        self._index = np.cumsum(has) - 1  # line -> its place among the lines with a dict

    def dense(self, r):
        j = self._index[r]
        a, b = self.at[j], self.at[j + 1]
        out = np.zeros(self.size, dtype=np.int64)
        out[self.slot[a:b]] = self.count[a:b]
        return out


def _slots(col, size, none_ok):
    """Each line's {slot: count} (jsonl._dense's rules: slots "0".."size-1", counts in 0..2^63-1) checked at once
    over all the lines, a _Slots; null is ok where none_ok (log2 histograms written with log_hist=False)."""
    n = len(col)
    has = np.fromiter((type(v) is dict for v in col), bool, n)
    ok = has | np.fromiter((v is None for v in col), bool, n) if none_ok else has.copy()
    rows = np.flatnonzero(has)
    dicts = [col[r] for r in rows.tolist()]
    lens = np.fromiter(map(len, dicts), np.int64, len(dicts))
    at = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    keys = list(itertools.chain.from_iterable(dicts))
    counts = list(itertools.chain.from_iterable(d.values() for d in dicts))
    m = len(keys)
    key_ok = np.fromiter((k.isascii() and k.isdigit() and len(k) < 6 for k in keys), bool, m)
    slot = np.fromiter(map(int, keys), np.int64, m) if key_ok.all() else \
        np.fromiter((int(k) if good else size for k, good in zip(keys, key_ok.tolist())), np.int64, m)
    cnt = None
    if set(map(type, counts)) <= {int}:
        try:
            cnt = np.array(counts, dtype=np.int64)
            cnt_ok = cnt >= 0
        except OverflowError:
            cnt = None
    if cnt is None:
        cnt_ok = np.fromiter((type(c) is int and 0 <= c <= fields.INT64_MAX for c in counts), bool, m)
        cnt = np.fromiter((c if good else 0 for c, good in zip(counts, cnt_ok.tolist())), np.int64, m)
    line = np.repeat(np.arange(len(rows)), lens)
    fine = key_ok & (slot < size) & cnt_ok
    ok[rows[np.bincount(line[~fine], minlength=len(rows)) > 0]] = False
    return _Slots(size, ok, has, at, slot, cnt)


def _counts_ok(col):
    if _types(col) == {int}:
        try:
            a = np.array(col, dtype=np.int64)
            return (a >= 0) & (a <= fields.EXACT)
        except OverflowError:
            pass
    return np.fromiter((v is None or type(v) is int and 0 <= v <= fields.EXACT for v in col), bool, len(col))


def _float_counts_ok(col):
    """fields.scalar()'s rule for a count kept as a float (hist_count): null, NaN, or an integral value in
    0..2^63-1 (an int within 2^53)."""
    if _types(col) <= {float, _NONE}:
        a = np.array(col, dtype=np.float64)
        with np.errstate(invalid="ignore"):
            return np.isnan(a) | ((a >= 0) & (a <= fields.INT64_MAX) & (a == np.floor(a)))
    return np.fromiter((v is None or type(v) is int and 0 <= v <= fields.EXACT or type(v) is float and
                        (v != v or 0 <= v <= fields.INT64_MAX and v == int(v)) for v in col), bool, len(col))


_CHECK = {"float": _floats_ok, "count": _counts_ok, "scalar": _float_counts_ok}
