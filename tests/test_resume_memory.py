"""A monitor rewound in its own process (load_state_dict of an earlier checkpoint after running further) keeps
each step once in mon.history(), with the values of the run that goes on, as the file sinks do. Checked against
the test's own float64 hooks."""
import numpy as np
import pytest
import torch

import hookstats

from resume_loop import LOOP

CKPT_AT, END = 14, 24  # the checkpoint holds steps 0..14; both runs go on to step 24


def _rewound(keep):
    ns = {}
    exec(LOOP, ns)
    model, opt = ns["make"]()
    seen, clock = [], [0]
    ns["own_hooks"](model, seen, clock)
    mon = hookstats.attach(model, history=True, keep=keep, log_every=4, alerts=False)
    ns["train"](model, opt, range(CKPT_AT + 1), clock, 1)
    ckpt = mon.state_dict()
    ns["train"](model, opt, range(CKPT_AT + 1, END + 1), clock, 1)
    mon.load_state_dict(ckpt)
    first = [(s, t, v) for s, t, v in seen if s <= CKPT_AT]
    seen.clear()
    ns["train"](model, opt, range(CKPT_AT + 1, END + 1), clock, 2)  # other data: other values than the first run's
    mon.flush()
    df = mon.history()
    mon.remove()
    want = {}
    for s, t, v in first + seen:
        want.setdefault((s, t), []).append(v.numpy())
    return df, {k: np.concatenate(v) for k, v in want.items()}


@pytest.mark.parametrize("keep", [1000, 12], ids=["all-steps", "keep-12"])
def test_history_after_a_rewind_has_each_step_once_with_the_second_runs_values(keep):
    df, want = _rewound(keep)
    means = df[(df["stat"] == "mean") & (df["phase"] == "train")]
    keys = list(zip(means["step"].astype(int), means["target"]))
    assert len(keys) == len(set(keys)), "a step kept twice"
    kept = sorted(k for k in want if k[0] > END - keep)
    assert sorted(keys) == kept
    for (step, target), v in zip(keys, means["value"].astype(float)):
        w = want[(step, target)]
        np.testing.assert_allclose(v, w.mean(), rtol=1e-6, atol=1e-6 * np.abs(w).max())
