"""Which train steps the running histograms hold: stats()' hist_steps, as a few ranges however long the run."""


class HistSteps:
    """Which train steps the running histograms hold (stats()' hist_steps): {"count", "first", "last", "steps"} of
    the finished histogram steps since attach or reset(), and the open step if it is one and a train forward ran in
    it; None before any. "steps" lists them as a tuple of ranges (the ramp and the grid of clock.is_hist_step, split
    where a pause skipped one): a few ranges however long the run. The eval phase counts its histograms in every
    forward (its records say None)."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.count, self.ranges = 0, []

    def on_step_end(self, clock, step, sampled, hist, evaluated=False):
        if hist:
            self.count += 1
            self.ranges = extend_ranges(self.ranges, step)

    def read(self, clock):
        count, ranges = self.count, self.ranges
        if clock.step_hist and clock.step_trained:
            count, ranges = count + 1, extend_ranges(ranges, clock.step_count)
        if not count:
            return None
        return {"count": count, "first": ranges[0].start, "last": ranges[-1][-1], "steps": tuple(ranges)}

    def saved(self):
        """The finished histogram steps as [[start, stop, step], ...] (torch.load(weights_only=True) reads it)."""
        return [[r.start, r.stop, r.step] for r in self.ranges]

    @staticmethod
    def parsed(saved):
        """saved()'s list as ranges, checked (ascending, none empty); a ValueError names what is wrong."""
        if not isinstance(saved, (list, tuple)):
            raise ValueError(f"load_state_dict: field 'hist_steps' must be a list, got {type(saved).__name__}")
        ranges, last = [], -1
        for k, r in enumerate(saved):
            ok = (isinstance(r, (list, tuple)) and len(r) == 3
                  and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in r) and r[2] > 0)
            if not ok or len(range(*r)) == 0 or r[0] <= last:
                raise ValueError(f"load_state_dict: hist_steps[{k}] must be [start, stop, step] of a non-empty range "
                                 f"of steps after the previous one, got {r!r:.60}")
            ranges.append(range(*r))
            last = ranges[-1][-1]
        return ranges

    def load(self, ranges):
        """Holds the histogram steps of a checkpoint (parsed()'s ranges) instead of its own."""
        self.count, self.ranges = sum(len(r) for r in ranges), list(ranges)


def extend_ranges(ranges, step):
    """ranges (a list of ranges, ascending) with `step` (above them all) added: the last range extended when step
    keeps its stride, else a new one. A new list; the ranges are not changed."""
    if ranges:
        last = ranges[-1]
        if len(last) == 1:
            return ranges[:-1] + [range(last.start, step + 1, step - last.start)]
        if step - last[-1] == last.step:
            return ranges[:-1] + [range(last.start, step + 1, last.step)]
    return ranges + [range(step, step + 1)]
