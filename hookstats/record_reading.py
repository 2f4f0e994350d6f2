"""Records read back: one builder for every reader (tables, `hookstats report`, the file readers) of a saved file's
line, a MemorySink row or a table's row, and a statistic read from a record of either scope. records.py builds
them from raw states."""
import functools

from . import buckets, statistics
from .phases import phase_label, record_phase

KEY_FIELDS = ("target", "module", "kind", "leaf", "phase")  # what a history record says of its target, first

# a statistic under its other scope's name: stats() records have min/max, history records running_min/max
_SAME = {"min": "running_min", "max": "running_max", "running_min": "min", "running_max": "max"}


def value(record, name):
    """Statistic `name` of a record of either scope, or None where it has none: its own value, else (min/max) the
    other scope's name for it, else a SINKS statistic derived from the record's values (statistics.from_record)."""
    if record.get(name) is not None:
        return record[name]
    if record.get(_SAME.get(name)) is not None:
        return record[_SAME[name]]
    st = statistics.BY_NAME.get(name)
    return statistics.from_record(name, record) if st is not None and st.scope == statistics.SINKS else None


def record(fields, **extra):
    """A record rebuilt from its values (a saved file's line, a MemorySink row, a table's row): KEY_FIELDS first (a
    missing phase is "train", as in files of versions without phases), then the statistics in the table's record
    order, then any other field as given (a later version's), and `extra` over them; log2_hist summed from the float
    buckets where only those were kept."""
    fields = {**fields, **extra}
    out = {k: fields.get(k, "") for k in KEY_FIELDS if k != "phase"}
    out["phase"] = record_phase(fields)
    out.update((k, fields[k]) for k in _order(tuple(fields)))
    if "log2_hist" not in fields and fields.get("float_hist") is not None:
        out["log2_hist"] = buckets.log2_hist(fields["float_hist"])
    return out


@functools.lru_cache(maxsize=1024)
def _order(names):
    """record()'s order of the fields `names` after KEY_FIELDS: a history's records share a few key sets, so the
    order is worked out once per set, not once per record."""
    known = [st.name for st in statistics.TABLE if st.name in names]
    return tuple(dict.fromkeys([*known, *(k for k in names if k not in KEY_FIELDS)]))


def has_buckets(record):
    """Whether a history record carries float buckets that counted values (a step that counted the histograms)."""
    return record.get("float_hist") is not None and (record.get("hist_count") or 0) > 0


def last_records(items, bucket_figures=()):
    """Per target and phase the record of its last step, from (step, record) pairs (a run's history) or a history
    read as columns (hookstats.sinks.Columns), labelled "target (phase)" outside the train phase; the
    `bucket_figures` (statistics of the float buckets) from its last record that has buckets: a step that counted
    no histograms has none, not NaN figures."""
    if callable(getattr(items, "last_records", None)):
        return items.last_records(bucket_figures)
    last, with_buckets = {}, {}
    for step, rec in items:
        t = phase_label(rec["target"], record_phase(rec))
        if step >= last.get(t, (-1, None))[0]:
            last[t] = (step, rec)
        if has_buckets(rec) and step >= with_buckets.get(t, (-1, None))[0]:
            with_buckets[t] = (step, rec)
    return [record(rec, target=t, **({k: with_buckets[t][1].get(k) for k in bucket_figures} if t in with_buckets
                                     else {})) for t, (_, rec) in last.items()], bool(with_buckets)
