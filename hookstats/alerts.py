"""Alerts evaluated on the device at each recorded step and read at flush time: NaN/Inf seen, dead units
(near-zero fraction above a threshold for K steps), std exploding or vanishing against the target's own
running average. Each alert fires once per target and kind."""
import dataclasses

import numpy as np
import torch

from . import layout, statistics
from .alert_row import (ALERT_KINDS, DEAD, DEAD_RUN, EMA, EMA_N, EXPLODE, EXPLODE_REF, EXPLODE_STD,  # noqa: F401
                        FIRST_STEP_COLS, KIND_COLUMNS, NONFINITE, ROW_WIDTH, VANISH, VANISH_REF, VANISH_STD)
from .checks import check_arg
from .targets import FORWARD_KINDS, OPTIMIZER_KINDS

F = layout.FSTATE_SIZE


class AlertWarning(UserWarning):
    """A training problem seen in the statistics (NaN/Inf, dead units, exploding or vanishing std)."""


@dataclasses.dataclass(frozen=True)
class AlertRules:
    """dead_fraction/dead_steps: a target whose near-zero fraction is above dead_fraction for dead_steps
    recorded steps in a row is dead. std_factor: a step std above factor x (or below 1/factor x) the
    target's exponential average of past step stds (weight `ema` per step, after `warmup` steps; flagged
    steps are left out of the average). flight=K: when a flush raises alerts, the last K recorded steps of every
    target up to the first alert's step go to the sinks and mon.flights (hookstats/flight.py; 0: none)."""

    enabled: bool = True
    nonfinite: bool = True
    dead_fraction: float = 0.95
    dead_steps: int = 10
    std_factor: float = 10.0
    warmup: int = 10
    ema: float = 0.1
    flight: int = 0
    warning = AlertWarning

    def __post_init__(self):
        checks = {"enabled": (bool,), "nonfinite": (bool,), "dead_fraction": (float, 0, 1), "dead_steps": (int, 1),
                  "std_factor": (float, 1, None, True), "warmup": (int, 1), "ema": (float, 0, 1, True), "flight": (int, 0)}
        for name, rule in checks.items():  # frozen: the checked (Python) values replace NumPy scalars
            object.__setattr__(self, name, check_arg(name, getattr(self, name), *rule))

    def init_row(self, row):
        row.zero_()
        row[:, list(FIRST_STEP_COLS)] = -1

    def update(self, arow, srow, step, cfg):
        """arow: [T, W] alert state; srow: [T, F + istate] the step's statistics (layout of `cfg`, a
        StatsConfig). Device ops only."""
        if not self.enabled:
            return
        af = arow.view(torch.float64)
        stat = statistics.derive(statistics.ALERTED, srow.view(torch.float64)[:, :F], srow[:, F:], cfg)
        seen = srow[:, F + layout.COUNT] > 0
        if self.nonfinite:
            _first(arow[:, NONFINITE], stat["nonfinite"] > 0, step)

        dead_now = seen & (stat["near_zero"] > self.dead_fraction)
        run = arow[:, DEAD_RUN]
        run.copy_(torch.where(dead_now, run + 1, torch.where(seen, 0, run)))
        _first(arow[:, DEAD], run >= self.dead_steps, step)

        std = stat["std"]
        valid = torch.isfinite(std)  # NaN below two finite values
        ema, ema_n = af[:, EMA], arow[:, EMA_N]
        ready = valid & (ema_n >= self.warmup)
        explode = ready & (std > self.std_factor * ema)
        vanish = ready & (std * self.std_factor < ema)
        for mask, col, std_col, ref_col in ((explode, EXPLODE, EXPLODE_STD, EXPLODE_REF),
                                            (vanish, VANISH, VANISH_STD, VANISH_REF)):
            new = mask & (arow[:, col] < 0)
            af[:, std_col].copy_(torch.where(new, std, af[:, std_col]))
            af[:, ref_col].copy_(torch.where(new, ema, af[:, ref_col]))
            _first(arow[:, col], mask, step)
        calm = valid & ~explode & ~vanish  # a flagged step does not move the reference
        ema.copy_(torch.where(calm, torch.where(ema_n == 0, std, ema + self.ema * (std - ema)), ema))
        ema_n.add_(calm.long())

    def forget(self, row, step):
        """After a rewind to `step` (load_state_dict of an earlier checkpoint): what fired at a superseded step (>=
        step) may fire again in the run that goes on. Device ops only."""
        cols = list(FIRST_STEP_COLS)
        first = row[:, cols]
        row[:, cols] = torch.where(first >= step, -1, first)

    def read(self, row, keys, reported, order=None):
        """New alerts from a host copy of the alert row, by step, then by `order` (a sort key of TargetKey:
        the order in which a step reaches the targets). `reported` (a set) remembers what was raised."""
        if not self.enabled:
            return []
        rf = np.asarray(row).view(np.float64)
        nonfinite_before = any(kind == "nonfinite" for _, kind in reported)
        out = []
        for t, key in enumerate(keys):
            for col, kind in KIND_COLUMNS:
                step = int(row[t, col])
                if step < 0 or (key.id, kind) in reported:
                    continue
                reported.add((key.id, kind))
                out.append(self._alert(kind, key.id, step, t, rf))
                out[-1]["_order"] = order(key) if order is not None else t
        out.sort(key=lambda a: (a["step"], a.pop("_order")))
        first = next((a for a in out if a["kind"] == "nonfinite"), None)
        if first is not None and not nonfinite_before:
            first["message"] += " (the first target in forward order to see one)"
            first["first"] = True
        return out

    def _alert(self, kind, target, step, t, rf):
        if kind == "nonfinite":
            msg = f"NaN/Inf in {target} at step {step}"
        elif kind == "dead":
            msg = (f"{target} looks dead: near-zero fraction above {self.dead_fraction:g} for {self.dead_steps} "
                   f"steps (through step {step})")
        else:
            std_col, ref_col = (EXPLODE_STD, EXPLODE_REF) if kind == "exploding_std" else (VANISH_STD, VANISH_REF)
            std, ref = float(rf[t, std_col]), float(rf[t, ref_col])
            word = "exploding" if kind == "exploding_std" else "vanishing"
            msg = f"{target} std {word} at step {step}: {std:.3g} against its running average {ref:.3g}"
            return {"kind": kind, "target": target, "step": step, "message": msg, "std": std, "reference": ref}
        return {"kind": kind, "target": target, "step": step, "message": msg}


def step_order(modules, seen=None):
    """Sort key of TargetKey: the order in which a training step reaches targets. Forward targets by
    module in the order the forward first ran them (`seen`: name -> rank, filled by the hooks as they
    run; registration order for modules not seen yet), input before output; then backward ones from the
    last module to the first; parameter gradients last (read at the optimizer step)."""
    pos = {name: i for i, name in enumerate(modules)}
    seen = {} if seen is None else seen

    def rank(name):
        if name in seen:
            return seen[name]
        return len(pos) + pos.get(name, len(pos))

    def key(k):
        owner = k.module if k.module in pos or k.module in seen else k.module.rpartition(".")[0]
        i = rank(owner)
        if k.kind in FORWARD_KINDS:
            return (0, i, FORWARD_KINDS.index(k.kind))
        return (2 if k.kind in OPTIMIZER_KINDS else 1, -i, 0)
    return key


def _first(col, mask, step):
    """col <- step where mask holds and nothing was recorded yet (col < 0)."""
    col.copy_(torch.where(mask & (col < 0), step, col))
