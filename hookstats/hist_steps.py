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
