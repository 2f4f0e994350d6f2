"""The per-step history on the device: at each step end the step's statistics go into a preallocated device ring
with device ops only, each field by its per-step rule (hookstats/rawstate.py): moments as measured (a state's fstate
holds the open step alone, closed_f the steps before it: nothing is subtracted), min/max running, counts as the
istate's growth since the previous step (exact integers; no float buckets: step_slots), and the step's own amax
(largest |x|, from the step's own min/max the running ones replace: the delayed-scaling what-if reads it). Every `log_every` steps the
ring goes to the host in one packed transfer (pinned + non_blocking on CUDA) and on to delivery.py (records, sinks,
alerts); at each step that counted the histograms the float buckets' growth since the last such step goes into a
preallocated row (a stack and a subtraction in place: no host read, no allocation) and on with the same copy, so each such step's
record carries its own buckets. The rows are sized for the steady state (grown_rows): a histogram step that finds
them full (the ramp's first window, or a window holding more than MAX_GROWN_ROWS) starts the copy early."""
import sys

import numpy as np
import torch

from . import layout, rawstate
from .state import order
from .alerts import ROW_WIDTH, AlertRules, step_order
from .config import check_count
from .delivery import Delivery, HistoryWarning
from .grad_norms import check_clip_norm
from .phases import Phase
from .device_memory import available_bytes, host_available_bytes
from .sinks.base import check_sinks
from .user_warning import warn_user

F = layout.FSTATE_SIZE  # per target and slot: F float64 (stored as int64 bits), the istate deltas, the step's amax


def step_slots(cfg):
    """The istate slots a ring keeps per step: the istate's prefix before the float buckets (what the flags
    measure: count, near-zero, the linear bins if configured, NaN/Inf, the op's own log2 slots if any)."""
    return rawstate.step_slots(cfg.nbins, cfg.flags)


def slot_width(cfg):
    """int64 columns per target of one step slot: the fstate, step_slots, the step's own amax."""
    return F + step_slots(cfg) + 1


MAX_GROWN_ROWS = 2  # float-bucket rows a ring holds between copies, each 32 KiB per target: a copy starts early past it


def grown_rows(capacity, cfg, phase=Phase.TRAIN):
    """The rows of float-bucket growth a ring of `capacity` slots keeps (0 without float buckets): as many as the
    histogram steps that `capacity` consecutive recorded steps hold past the ramp (ceil(capacity / hist_every)),
    at most MAX_GROWN_ROWS; eval: one (a validation pass a window, as a rule)."""
    if not cfg.float_hist:
        return 0
    if phase != Phase.TRAIN:
        return 1
    return min(-(-capacity // cfg.hist_every), MAX_GROWN_ROWS)


def ring_bytes(capacity, targets, cfg, phase=Phase.TRAIN):
    """(device, host staging per copy) bytes of the packed buffer and the float-bucket rows of one ring: the device
    holds the baseline row besides the growth rows, the staging the growth rows alone."""
    rows = grown_rows(capacity, cfg, phase)
    packed = targets * (ROW_WIDTH + capacity * slot_width(cfg)) * 8
    row = targets * layout.FLOAT_SLOTS * 8
    return packed + (1 + rows) * row * bool(rows), packed + rows * row


def check_ring_fits(capacity, targets, cfg, device):
    """Raises a ValueError naming history= when a ring of `capacity` steps for `targets` targets would take more
    than `device` (and the host, for its staging copies) has available now."""
    device = torch.device(device)
    dev, host = ring_bytes(capacity, targets, cfg)
    copies = 2 if device.type == "cuda" else 1  # host staging buffers (Ring.host)
    needs = [(str(device), dev, available_bytes(device)), ("host (staging)", copies * host, host_available_bytes())]
    if device.type == "cpu":  # one memory for both
        needs = [("cpu", dev + copies * host, host_available_bytes())]
    for where, need, avail in needs:
        if avail is not None and need > avail:
            raise ValueError(f"history={capacity}: a ring of {capacity} steps for {targets} target(s) needs {need:,} "
                             f"bytes on {where}, and {avail:,} bytes are available; give history= fewer steps "
                             f"(history=True keeps log_every steps on the device)")


class Ring:
    """The ring of one device and phase ("train": a slot per step; "eval": a slot per validation pass, stamped with
    the step it ran in; the alert rules read the train phase only): the alert rows [T, alerts.ROW_WIDTH], then the step slots 0..capacity-1, each
    [T, slot_width] int64, all in one flat buffer so a flush is one contiguous transfer of its filled start.
    Float64 columns are stored bit-for-bit through an int64 view. With float buckets, bucket_rows holds
    grown_rows + 1 rows: bucket_rows[base_row] the running buckets at the last step that counted them (the
    baseline), bucket_rows[growth_rows[j]] the growth at the j-th such step of this copy (grown_at[j]: its slot). A
    histogram step stacks the buckets into a free row, the next baseline, and subtracts the baseline's row from it in
    place, which becomes that step's growth row: two passes over the buckets. A copy sends the growth rows."""

    def __init__(self, device, states, capacity, cfg, rules, old=None, phase=Phase.TRAIN):
        self.device, self.states, self.capacity, self.cfg, self.phase = device, list(states), capacity, cfg, phase
        self.keys = [s.key for s in self.states]
        t, isz = len(self.states), step_slots(cfg)
        self.isz, self.width = isz, slot_width(cfg)
        self.buf = torch.zeros(t * ROW_WIDTH + capacity * t * self.width, dtype=torch.int64, device=device)
        self.alert_row = self.buf[: t * ROW_WIDTH].view(t, ROW_WIDTH)
        self.slots = self.buf[t * ROW_WIDTH:].view(capacity, t, self.width)
        self.cur_f = torch.zeros(t, F, dtype=torch.float64, device=device)
        self.cur_i = torch.zeros(t, isz, dtype=torch.int64, device=device)
        self.closed_f = torch.empty(t, F, dtype=torch.float64, device=device)  # the states' closed_f, gathered
        self.prev_i = torch.zeros(t, isz, dtype=torch.int64, device=device)
        self.fbase = layout.float_base(cfg.nbins, cfg.flags)
        rows = grown_rows(capacity, cfg, phase)
        self.bucket_rows = torch.zeros(1 + rows, t, layout.FLOAT_SLOTS, dtype=torch.int64,
                                       device=device) if rows else None
        self.base_row, self.growth_rows, self.grown_at = 0, [], []
        self.empty_f = rawstate.empty(device=device)
        self.running = rawstate.running_mask(device)  # the fields a record takes from the running totals
        # the open step's moments measured before a mon.reset() (which empties the states): the step's
        # record keeps them, the running totals do not; `carrying` says (host side) whether there are any
        self.carry_f = self.empty_f.repeat(t, 1)
        self.carrying = False
        rules.init_row(self.alert_row)
        if old is not None:  # a target appeared: keep what the old ring knew of the others
            idx = [self.keys.index(k) for k in old.keys]
            sel = torch.tensor(idx, device=device)
            self.prev_i.index_copy_(0, sel, old.prev_i)
            if self.bucket_rows is not None:
                self.bucket_rows[0].index_copy_(0, sel, old.bucket_rows[old.base_row])
            self.carry_f.index_copy_(0, sel, old.carry_f)
            self.carrying = old.carrying
            self.alert_row.index_copy_(0, sel, old.alert_row)
        pinned = device.type == "cuda"
        self.host = [torch.empty(self.buf.shape, dtype=torch.int64, device="cpu", pin_memory=pinned)
                     for _ in range(2 if pinned else 1)]
        self.host_b = [torch.empty((rows, t, layout.FLOAT_SLOTS), dtype=torch.int64, device="cpu", pin_memory=pinned)
                       for _ in self.host] if rows else []
        self.which = 0
        self.steps = []  # step number of each filled slot (host side: the step count is host-side)

    def nbytes(self):
        dev = sum(t.numel() * t.element_size() for t in (self.buf, self.cur_f, self.cur_i, self.closed_f, self.prev_i,
                                                           self.carry_f, self.bucket_rows) if t is not None)
        return dev, sum(h.numel() * h.element_size() for h in self.host + self.host_b)

    def _gather(self):
        """The states' open-step moments into cur_f (exact, whatever came before) and running counts into
        cur_i; returns the fstates."""
        order(self.states)
        fs = [s.fstate for s in self.states]
        torch.cat(fs, out=self.cur_f.view(-1))
        torch.stack([s.istate[: self.cur_i.shape[1]] for s in self.states], out=self.cur_i)
        return fs

    def _buckets(self, out=None):
        """The states' running float buckets [T, FLOAT_SLOTS] (into `out`, else a new tensor)."""
        order(self.states)
        return torch.stack([s.istate[self.fbase:] for s in self.states], out=out)

    def grown_full(self):
        """Whether every float-bucket growth row holds a step of this copy."""
        return self.bucket_rows is not None and len(self.grown_at) == len(self.bucket_rows) - 1

    def before_reset(self):
        """mon.reset() is about to empty the states: what the open step measured so far moves into the carry
        (moments) and out of prev_i (counts: the step's delta then adds them), so its record stays whole."""
        self._gather()
        self.carry_f.copy_(rawstate.combine(self.carry_f, self.cur_f))
        self.prev_i.sub_(self.cur_i)
        if self.bucket_rows is not None:  # the states restart from 0: the next growth adds what they counted so far
            self.bucket_rows[self.base_row].sub_(self._buckets())
        self.carrying = True

    def rebase(self):
        """The states' counts and buckets now are the baseline of the next record and flush (nothing carried)."""
        self._gather()
        self.prev_i.copy_(self.cur_i)
        if self.bucket_rows is not None:  # after a flush: no growth row is waiting
            self._buckets(out=self.bucket_rows[self.base_row])
        self.carry_f.copy_(self.empty_f)
        self.carrying = False

    def record(self, step, rules, hist=True):
        """Writes the step's statistics into the next slot and closes the step (its fstate merged into
        closed_f, then emptied for the next one): device ops only, no host read. hist: whether the step counted
        the histograms (the float buckets grow on no other): then their growth goes in the next row (the caller
        starts a copy first when the rows are full)."""
        fs, closed = self._gather(), [s.closed_f for s in self.states]
        torch.cat(closed, out=self.closed_f.view(-1))
        row = self.slots[len(self.steps)]
        stats_row, floats = row[:, :F + self.isz], row.view(torch.float64)
        torch.sub(self.cur_i, self.prev_i, out=stats_row[:, F:])
        total = rawstate.combine(self.closed_f, self.cur_f)
        measured = self.cur_f
        if self.carrying:
            measured = rawstate.combine(self.carry_f, self.cur_f)
            self.carry_f.copy_(self.empty_f)
            self.carrying = False
        # per field its per-step rule: what the step measured, or running since attach or reset (min/max); written
        # in place, so the step's own amax (one reduction) costs no more kernels than a where and a copy did
        torch.where(self.running, total, measured, out=floats[:, :F])
        torch.linalg.vector_norm(measured[:, layout.MIN:layout.MAX + 1], ord=float("inf"), dim=1, out=floats[:, -1])
        torch._foreach_copy_(closed, list(total.unbind(0)))
        torch._foreach_copy_(fs, [self.empty_f] * len(fs))
        self.prev_i.copy_(self.cur_i)
        if hist and self.bucket_rows is not None:
            base = self.bucket_rows[self.base_row]
            free = next(r for r in range(len(self.bucket_rows)) if r != self.base_row and r not in self.growth_rows)
            now = self._buckets(out=self.bucket_rows[free])
            torch.sub(now, base, out=base)
            self.growth_rows.append(self.base_row)
            self.base_row = free
            self.grown_at.append(len(self.steps))
        if self.phase == Phase.TRAIN:
            rules.update(self.alert_row, stats_row, step, self.cfg)
        self.steps.append(step)

    def start_copy(self):
        """Starts the one device-to-host copy of the alert row and the filled slots, and of the filled float-bucket
        growth rows; returns what History._finish() needs. The rows are written again only by later kernels on the
        same stream, which run after the copy has read them."""
        filled = self.alert_row.numel() + len(self.steps) * self.slots[0].numel()
        host = self.host[self.which][:filled]
        host_b = None
        cuda = self.device.type == "cuda"
        if self.grown_at:
            host_b = self.host_b[self.which][:len(self.grown_at)]
            for j, r in enumerate(self.growth_rows):
                host_b[j].copy_(self.bucket_rows[r], non_blocking=cuda)
        self.which = (self.which + 1) % len(self.host)
        host.copy_(self.buf[:filled], non_blocking=cuda)
        event = None
        if cuda:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
        pending = (host, list(self.steps), event, list(self.keys), host_b, list(self.grown_at))
        self.steps.clear()
        self.grown_at.clear()
        self.growth_rows.clear()
        return pending

    @staticmethod
    def unpack(host, steps, targets, cfg):
        """(alert rows [T, ROW_WIDTH], fstates [S, T, F], counts [S, T, step_slots], the steps' own amax [S, T]) of
        a copy start_copy() made."""
        buf = host.numpy()
        arow = buf[: targets * ROW_WIDTH].reshape(targets, ROW_WIDTH)
        slots = buf[targets * ROW_WIDTH:].reshape(steps, targets, slot_width(cfg))
        return arow, slots.view(np.float64)[..., :F], slots[..., F:-1], slots.view(np.float64)[..., -1]


class History:
    """Per-step statistics of every train-phase target, and with attach(eval=True) per validation pass those of the
    eval phase (the eval forwards measured while one step was open, recorded when it ends, with its step and
    phase "eval"), kept on the device (a Ring per device and phase) and handed to `delivery` at each flush.

    Its arguments are those of history_options(): log_every: steps between flushes; capacity: ring slots;
    keep: steps kept on the host for mon.history() (the sinks get every step); sinks: hookstats.sinks.Sink objects
    (sinks/base.py), or any object with write(step, records); rules: an AlertRules (enabled=False for none).
    """

    def __init__(self, monitor, log_every, capacity, sinks, rules, keep, clip_norm=None):
        self.monitor, self.cfg = monitor, monitor.cfg
        self.log_every, self.capacity, self.rules = log_every, capacity, rules
        self.delivery = Delivery(self.cfg, sinks, keep, rules, step_order(monitor.modules, monitor.forward_order),
                                 clip_norm)
        self.rings = {}  # (device, phase) -> Ring
        self._pending = []
        self._last_flush = monitor.step_count  # a run resumed at step N (attach(start_step=N)) flushes from there
        self._no_hist = set()  # recorded steps that counted no histograms (hist_every), until delivered
        self._broken = self._closed = False
        self._pass_read = None  # the open step whose validation pass a read of the history recorded early
        self._late_eval = False  # eval forwards after that read, in that step: recorded with the next step
        known = self._states(Phase.TRAIN)
        devices = {p.device for m in monitor.modules.values() for p in m.parameters(recurse=False)}
        for device in known or devices or {torch.device("cpu")}:
            check_ring_fits(capacity, max(1, len(known.get(device, ()))), self.cfg, device)
        if monitor.step_count:
            self.delivery.resume(monitor.step_count)
        monitor.split_steps()
        monitor.step_listeners.append(self._on_step_end)

    @property
    def memory_sink(self):
        """The MemorySink holding the steps mon.history() keeps."""
        return self.delivery.memory_sink

    @property
    def alerts(self):
        return self.delivery.alerts

    @property
    def flights(self):
        return self.delivery.flights

    # ---- recording ----
    def _states(self, phase):
        by_dev = {}
        for _, device, st in self.monitor.states(phase, reached_only=False):
            by_dev.setdefault(device, []).append(st)
        return by_dev

    def _on_step_end(self, monitor, step, sampled, hist, evaluated=False):
        if step == self._pass_read:  # its pass is written: what ran after the read goes with the next step
            self._pass_read, self._late_eval, evaluated = None, evaluated, False
        elif self._late_eval:
            self._late_eval, evaluated = False, True
        if self._broken or self._closed or not (sampled or evaluated):
            return
        try:
            self.record(step, hist, sampled, evaluated)
            if step + 1 - self._last_flush >= self.log_every:
                self.flush(wait=False)
        except Exception as e:  # the user's training step must go on
            self._broken = True
            warn_user(f"hookstats: history stopped after an error at step {step}: {e!r}", HistoryWarning)

    def record(self, step, hist=True, sampled=True, evaluated=False):
        """Snapshots the statistics of `step` (measured since the previous snapshot) on the device; hist: whether
        it counted the histograms (its window's float buckets hold only such steps); sampled: whether its train
        phase was measured; evaluated: whether a validation pass (eval forwards) ran in it."""
        if sampled and not hist:
            self._no_hist.add(step)
        for phase in (Phase.TRAIN,) * sampled + (Phase.EVAL,) * evaluated:
            for device, states in self._states(phase).items():
                ring = self._ring(device, states, phase)
                counts = hist or phase != Phase.TRAIN  # eval forwards count the histograms always
                if len(ring.steps) == ring.capacity:
                    self._start_copy(ring)
                elif counts and ring.grown_full():
                    # every ring's steps go along, so the sinks get the phases' steps in order as at a flush
                    for other in self.rings.values():
                        if other.steps:
                            self._start_copy(other)
                ring.record(step, self.rules, counts)

    def record_open_pass(self):
        """A read of the history: the validation pass of the open step (eval forwards measured since its last
        record) is recorded now, stamped with that step, instead of when the step ends (steps="manual" and compiled
        models validate after their step's end, in the next step). Eval forwards later in the same step are recorded
        with the next step: a (step, target) is written once."""
        clock = self.monitor.clock
        if self._broken or self._closed or not clock.step_eval or clock.step_count == self._pass_read:
            return
        try:
            self.record(clock.step_count, sampled=False, evaluated=True)
        except Exception as e:  # the user's training step must go on
            self._broken = True
            warn_user(f"hookstats: history stopped after an error at step {clock.step_count}: {e!r}", HistoryWarning)
            return
        self._pass_read, self._late_eval = clock.step_count, False  # a pass carried here is in this record
        clock.pass_recorded()

    def before_reset(self):
        """mon.reset() restarts the running totals, not the history: the open step keeps what it measured."""
        if self._broken or self._closed:
            return
        try:
            for phase in Phase:
                for device, states in self._states(phase).items():
                    self._ring(device, states, phase).before_reset()
        except Exception as e:  # the user's training step must go on
            self._broken = True
            warn_user(f"hookstats: history stopped after an error in reset(): {e!r}", HistoryWarning)

    def rebase(self):
        """After Monitor.load_state_dict(): the loaded totals are every ring's starting point, so the next step's
        record holds what that step measures alone."""
        self.flush(wait=True)
        for phase in Phase:  # the eval totals too: the next validation pass's record holds that pass alone
            for device, states in self._states(phase).items():
                ring = self._ring(device, states, phase)
                ring.rebase()
                if phase == Phase.TRAIN:
                    self.rules.forget(ring.alert_row, self.monitor.step_count)
        self._last_flush = self.monitor.step_count
        self._pass_read, self._late_eval = None, False  # a read's early pass was of a step the load took back
        self.delivery.resume(self.monitor.step_count)

    def _ring(self, device, states, phase=Phase.TRAIN):
        """The ring of `device` and `phase`, remade (keeping what it knew) when targets appeared since."""
        ring = self.rings.get((device, phase))
        if ring is None or len(ring.states) != len(states):
            check_ring_fits(self.capacity, len(states), self.cfg, device)
            if ring is not None and ring.steps:
                self._start_copy(ring)
            self.rings[(device, phase)] = ring = Ring(device, states, self.capacity, self.cfg, self.rules, old=ring,
                                                      phase=phase)
        return ring

    def _start_copy(self, ring):
        # a host staging buffer is reused only after what it held went to the sinks; the copies before it go
        # first, so the sinks get the steps in the order they were copied
        while sum(p[0] is ring for p in self._pending) >= len(ring.host):
            self._finish(self._pending.pop(0))
        self._pending.append((ring, *ring.start_copy()))

    def _finish(self, pending):
        ring, host, steps, event, keys, host_b, grown_at = pending
        if event is not None:
            event.synchronize()
        hist = [ring.phase != Phase.TRAIN or s not in self._no_hist for s in steps]  # eval counts them always
        if ring.phase == Phase.TRAIN:
            self._no_hist.difference_update(steps)
        arow, fs, counts, amax = Ring.unpack(host, len(steps), len(keys), self.cfg)
        grown = None if host_b is None else host_b.numpy()
        self.delivery.deliver(arow, fs, counts, steps, keys, grown, grown_at, hist, ring.phase, amax=amax)

    # ---- flushing ----
    def flush(self, wait=True):
        """Starts one packed copy per device of the filled slots and hands finished copies to the sinks.
        wait=False (the step-end path) leaves an unfinished CUDA copy for a later flush."""
        for ring in self.rings.values():
            if ring.steps:
                self._start_copy(ring)
        self._last_flush = self.monitor.step_count
        while self._pending:
            event = self._pending[0][3]
            if event is not None and not wait and not event.query():
                break  # copies finish in order: the later ones are not done either
            self._finish(self._pending.pop(0))

    def close(self):
        """Records the step still open (if it measured anything), flushes and closes every sink."""
        if self._closed:
            return
        self._closed = True
        if sys.is_finalizing():
            # called from a __del__ at interpreter exit: torch aborts on the tensor views a flush takes then
            # (THPVariable_clear), so the open step and unflushed steps are left out; the files close
            self.delivery.close()
            return
        clock = self.monitor.clock
        step = clock.step_count
        late = clock.step_eval and step == self._pass_read  # after a read that wrote this step's pass: the next step's
        evaluated = (clock.step_eval and not late) or self._late_eval
        if not self._broken and (clock.step_sampled or evaluated):
            self.record(step, clock.step_hist, clock.step_sampled, evaluated)
        if not self._broken and late:
            self.record(step + 1, sampled=False, evaluated=True)
        self.flush(wait=True)
        self.delivery.close()

    # ---- reading ----
    def frame(self):
        """Flushes, then the kept steps in long format (step, target, kind, stat, value)."""
        self.flush(wait=True)
        return self.delivery.memory_sink.frame()

    def nbytes(self):
        """(device bytes, pinned/host staging bytes) of the rings."""
        dev = host = 0
        for r in self.rings.values():
            d, h = r.nbytes()
            dev, host = dev + d, host + h
        return dev, host


def history_options(history=True, log_every=10, keep=1000, sinks=None, alerts=True, clip_norm=None):
    """attach()'s history arguments, checked (one clear error each) and given as History's keywords; None
    when no history is kept (history=False and no sinks). history: True/False, or the ring's capacity in
    steps (default log_every; a full ring flushes early). clip_norm: the max_norm the parameter gradients' norms
    are told against (grad_norms.py)."""
    if isinstance(history, np.bool_):
        history = bool(history)
    capacity = None if isinstance(history, bool) else check_count("history", history)
    log_every, keep = check_count("log_every", log_every), check_count("keep", keep)
    if sinks is not None and not isinstance(sinks, (list, tuple)):
        raise ValueError(f"sinks must be a list of sinks, got {type(sinks).__name__}")
    if not isinstance(alerts, (bool, AlertRules)):
        raise ValueError(f"alerts must be True, False or an AlertRules, got {alerts!r}")
    if history is False and not sinks:
        return None
    rules = AlertRules() if alerts is True else alerts or AlertRules(enabled=False)
    return {"log_every": log_every, "capacity": capacity or log_every, "sinks": check_sinks(sinks), "rules": rules,
            "keep": keep, "clip_norm": check_clip_norm(clip_norm)}


def attach_history(monitor, options):
    """A History for `monitor` from history_options()' keywords (None: no history); a monitor whose history
    cannot start is removed before the error reaches the user."""
    if options is None:
        return None
    try:
        return History(monitor, **options)
    except Exception:
        monitor.remove()
        raise
