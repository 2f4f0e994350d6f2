"""The amaxes (largest |x|) of the recorded steps of each target, kept on the host for the delayed-scaling what-if
(hookstats/whatif.py): before(step) is the largest of the amaxes of the `length` steps before `step`, as
TransformerEngine's amax history with amax_compute_algo "max" gives the scale of that step. Fed at each delivery
with each step's own amax, which the history's ring keeps beside the running min/max (hookstats/history.py)."""
import numpy as np


class AmaxWindow:
    def __init__(self, length):
        self.length = length
        self._phases = {}  # phase -> (steps [K], amax [K, targets], {target id: column})

    def add(self, phase, ids, steps, amax, present):
        """Records steps [S] of targets `ids` [T]: amax [S, T], NaN where not present [S, T]."""
        old_steps, old, cols = self._phases.get(phase, (np.zeros(0, np.int64), np.zeros((0, 0)), {}))
        for i in ids:
            cols.setdefault(i, len(cols))
        table = np.full((len(old_steps) + len(steps), len(cols)), np.nan)
        table[:len(old_steps), :old.shape[1]] = old
        at = np.array([cols[i] for i in ids], dtype=np.int64)
        table[len(old_steps):, at] = np.where(present, amax, np.nan)
        self._phases[phase] = (np.concatenate([old_steps, np.asarray(steps, np.int64)]), table, cols)

    def before(self, phase, ids, step):
        """[T]: the largest amax of each target over the steps in [step - length, step); NaN where none."""
        steps, table, cols = self._phases.get(phase, (np.zeros(0, np.int64), np.zeros((0, 0)), {}))
        rows = table[(steps >= step - self.length) & (steps < step)]
        out = np.full(len(ids), np.nan)
        known = [k for k, i in enumerate(ids) if i in cols]
        if rows.shape[0] and known:
            picked = rows[:, [cols[ids[k]] for k in known]]
            has = ~np.isnan(picked).all(axis=0)
            out[np.array(known)[has]] = np.nanmax(picked[:, has], axis=0)
        return out

    def prune(self, phase, step):
        """Forgets the steps no later step's window reaches (those before step - length)."""
        if phase in self._phases:
            steps, table, cols = self._phases[phase]
            keep = steps >= step - self.length
            self._phases[phase] = (steps[keep], table[keep], cols)
