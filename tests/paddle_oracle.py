"""The test's own Paddle hooks, the oracle of the Paddle tests: they copy every value hookstats should measure
(layer outputs, inputs, gradients into outputs, parameter gradients) to float64 NumPy, keyed as hookstats'
target ids and phases, and summarize them in NumPy."""
import numpy as np
import paddle
import torch
import zoo_oracle
from float_oracle import float_buckets

FLOATS = (paddle.float32, paddle.float64, paddle.float16, paddle.bfloat16)


def leaves(obj, path=""):
    """Every Paddle tensor inside tuples, lists, dicts and dataclasses, named as the torch oracle names them."""
    return zoo_oracle.leaves(obj, path, take=lambda t: isinstance(t, paddle.Tensor))


def host(t):
    """(float32-or-64 NumPy copy, float64 copy) of a Paddle tensor: float16/bfloat16 go through float32 (exact)."""
    v = t.detach().astype("float64" if t.dtype == paddle.float64 else "float32").numpy().copy()
    return v, v.astype(np.float64)


class PaddleOracle:
    """Plain Paddle hooks on `layers` (name -> layer) of `root`: a forward is a train forward when root is in
    training mode with gradients enabled, else eval; eval forwards are kept only with keep_eval."""

    def __init__(self, root, layers, inputs=False, grads=True, keep_eval=True):
        self.root, self.keep_eval, self.data, self.handles = root, keep_eval, {}, []
        self.enabled = True  # the test turns it off over the steps hookstats does not sample
        for name, m in layers.items():
            self.handles.append(m.register_forward_post_hook(self.post(name, grads)))
            if inputs:
                self.handles.append(m.register_forward_pre_hook(self.pre(name)))

    def phase(self):
        return "train" if self.root.training and paddle.is_grad_enabled() else "eval"

    def add(self, phase, tid, t):
        if self.enabled and t.dtype in FLOATS and (phase == "train" or self.keep_eval):
            self.data.setdefault((phase, tid), []).append(host(t))

    def post(self, name, grads):
        def hook(layer, inputs, out):
            phase = self.phase()
            for leaf, t in leaves(out):
                self.add(phase, f"{name}:output{leaf}", t)
                if grads and not t.stop_gradient and t.dtype in FLOATS:
                    t.register_hook(lambda g, tid=f"{name}:grad_output{leaf}", ph=phase: self.add(ph, tid, g))
        return hook

    def pre(self, name):
        def hook(layer, inputs):
            for i, a in enumerate(inputs):  # one-input layers: the input is named like a tensor ("fc:input")
                for leaf, t in leaves(a, "" if i == 0 else f"[{i}]"):
                    self.add(self.phase(), f"{name}:input{leaf}", t)
        return hook

    def param_grads(self, named):
        """Call just before the optimizer steps: each parameter's accumulated gradient."""
        for name, p in named:
            if p.grad is not None:
                self.add("train", f"{name}:param_grad", p.grad)

    def records(self, phase):
        return {tid: summarize(parts) for (ph, tid), parts in self.data.items() if ph == phase}

    def remove(self):
        for h in self.handles:
            h.remove()


def summarize(parts):
    v = np.concatenate([d.reshape(-1) for _, d in parts])
    fin = v[np.isfinite(v)]
    buckets = sum(float_buckets(torch.from_numpy(h.reshape(-1))) for h, _ in parts)
    return {"count": v.size, "finite": fin.size, "nan": int(np.isnan(v).sum()),
            "mean": fin.mean() if fin.size else np.nan, "std": fin.std(ddof=1) if fin.size > 1 else np.nan,
            "min": fin.min() if fin.size else np.nan, "max": fin.max() if fin.size else np.nan,
            "near_zero_count": int((np.abs(v.astype(np.float32)) <= np.float32(1e-6)).sum()), "float_hist": buckets}


def assert_matches(got, want, rtol=1e-5):
    """hookstats' records (mon.stats()) against the oracle's: the same targets, exact counts, extremes and
    histograms; moments within rtol of the values' scale (the kernel's partial sums are not NumPy's order)."""
    assert sorted(got) == sorted(want), (sorted(set(got) ^ set(want)))
    for tid, w in want.items():
        g = got[tid]
        for k in ("count", "finite", "nan", "near_zero_count"):
            assert g[k] == w[k], (tid, k, g[k], w[k])
        for k in ("min", "max"):
            assert g[k] == w[k], (tid, k, g[k], w[k])
        scale = max(abs(w["min"]), abs(w["max"]), 1e-30) if w["finite"] else 1.0
        for k in ("mean", "std"):
            assert np.isnan(g[k]) == np.isnan(w[k]) and not abs(g[k] - w[k]) > rtol * scale, (tid, k, g[k], w[k])
        np.testing.assert_array_equal(g["float_hist"], w["float_hist"], err_msg=tid)
