"""attach(): a model's adapter (frameworks.py), its options parsed once (options.py), its modules selected, and the
Monitor (facade.py) made, its history attached and the model's monitor noted (registry.py)."""
import inspect

from . import registry
from .facade import Monitor
from .frameworks import adapter_for
from .options import attach_options
from .user_warning import warn_user


def attach(model, *, modules=None, types=None, exclude=None, include_paramless=False, every=1, eval=None,
           steps="forward", inputs=False, outputs=True, grads=True, input_grads=False, param_grads=False,
           params=False, separate_calls=False, history=False, log_every=10, keep=1000, sinks=None, alerts=True,
           clip_norm=None, rank_zero_only=True, start_step=0, optimizer=None, config=None, **config_kwargs):
    """Hooks `model` and returns a :class:`Monitor` that measures it while it trains.

    The monitor is also a context manager: ``with hookstats.attach(model) as mon:`` removes the hooks on exit.
    A ``paddle.nn.Layer`` is measured through Paddle's hooks with the same keywords (see the PaddlePaddle how-to).

    Parameters
    ----------
    model : torch.nn.Module or paddle.nn.Layer
        The model to watch.
    modules : list of str, optional
        Names or glob patterns (``"encoder.*"``) of the modules to hook; the root model is ``""``. Default: every
        module with parameters of its own.
    types : type or tuple of types, optional
        Hook only modules of these classes (``nn.Linear``, ``(nn.Conv2d, nn.Linear)``).
    exclude : list of str, optional
        Names or glob patterns of modules to leave out.
    include_paramless : bool, default False
        Also hook modules without parameters of their own (activations, pooling).
    every : int, default 1
        Measure one step in `every` (step ``k`` is measured when ``k % every == 0``).
    eval : bool, optional
        Measure forwards in eval mode (validation passes), kept apart from the train phase. Default: on when the
        monitor keeps a history or has sinks, off otherwise.
    steps : {"forward", "manual"}, default "forward"
        What one step is: one root forward in training mode, or (``"manual"``) whatever ends with
        ``mon.step()``, for gradient accumulation.
    inputs : bool, default False
        Measure each hooked module's inputs.
    outputs : bool, default True
        Measure each hooked module's outputs.
    grads : bool, default True
        Measure the gradients flowing back into the outputs.
    input_grads : bool, default False
        Measure the gradients with respect to module inputs (a call that modifies its input in place is left
        out, and said once).
    param_grads : bool, default False
        Measure each parameter's gradient, once per optimizer step.
    params : bool, default False
        Measure the parameters themselves (``"fc1.weight:param"``) after each optimizer step (or at
        ``mon.step()``).
    separate_calls : bool, default False
        Keep each call of a module within a step apart (``"fc:output@1"``) instead of pooling them.
    history : bool or int, default False
        Keep every measured step's statistics (``mon.history()``, the sinks). An int sets how many steps the
        device buffer holds (default `log_every`; a full buffer is sent early). With the float buckets it also
        holds each histogram step's own buckets, 32 KiB a target, for as many histogram steps as a window holds
        (at most 2); a histogram step past them sends the steps before it early.
    log_every : int, default 10
        Steps between copies of the history to the host and the sinks.
    keep : int, default 1000
        Steps that ``mon.history()`` keeps on the host (the sinks get every step).
    sinks : list of sinks, optional
        Where the history goes: ``hookstats.sinks.CSVSink``, ``JSONLSink``, ``TensorBoardSink``, ``WandbSink``...
        Giving sinks keeps a history.
    alerts : bool or AlertRules, default True
        Warn when a target turns NaN/Inf, explodes or dies; an :class:`AlertRules` sets the thresholds, False
        turns the alerts off. ``AlertRules(flight=K)`` keeps the last K steps of every target before an alert
        (``mon.flights``, a ``flight_<step>.jsonl`` beside the file sinks).
    clip_norm : float, optional
        With `param_grads`, the ``max_norm`` of a ``clip_grad_norm_`` that the per-step gradient norms given to the
        sinks are told against (``mon.grad_norms(clip_norm)`` asks any max afterwards).
    rank_zero_only : bool, default True
        Under ``torch.distributed``, only rank 0 writes to the sinks (each rank keeps its own statistics;
        ``mon.reduce()`` merges them). False lets every rank write (rank ``r > 0`` to
        ``<stem>.rank<r><suffix>``).
    start_step : int, default 0
        The number of the first step: a resumed run goes on from its checkpoint's step
        (``mon.load_state_dict()`` sets it too).
    optimizer : paddle.optimizer.Optimizer, optional
        A Paddle model only: with `param_grads`, the optimizer whose ``step()`` measures the parameter gradients
        (Paddle has no global optimizer hook).
    config : StatsConfig, optional
        What each target measures; or give its fields as keywords instead.
    **config_kwargs
        :class:`StatsConfig` fields: ``hist_every`` (count the histograms on one measured step in `hist_every`;
        default: 10, or fewer so each `log_every` window holds one), ``linear_hist``, ``nbins``, ``lo``, ``hi``
        (a fixed-range linear histogram), ``eps`` and ``near_zero`` (what counts as near zero), ``log_hist``,
        ``float_hist``.

    Returns
    -------
    Monitor
        The monitor; read it with ``mon.stats()``, ``mon.history()``, ``mon.histogram()``.
    """
    from .history import attach_history
    adapter = adapter_for(model)
    options = attach_options(
        adapter, ATTACH_KEYWORDS, modules=modules, types=types, exclude=exclude, include_paramless=include_paramless,
        every=every, eval=eval, steps=steps, inputs=inputs, outputs=outputs, grads=grads, input_grads=input_grads,
        param_grads=param_grads, params=params, separate_calls=separate_calls, history=history, log_every=log_every,
        keep=keep, sinks=sinks, alerts=alerts, clip_norm=clip_norm, rank_zero_only=rank_zero_only,
        start_step=start_step, optimizer=optimizer, config=config, config_kwargs=config_kwargs)
    selected = adapter.select(options)
    adapter.check_model(selected)
    if registry.attached_monitor(model) is not None:
        warn_user("hookstats: this model already has a monitor attached, and both would measure every step: call "
                  "remove() on the first (or attach in `with hookstats.attach(model) as mon:`) before attaching again",
                  AttachedTwiceWarning)
    mon = Monitor(model, adapter, selected, options)
    mon.clock.start_at(options.start_step)
    mon.step_history = attach_history(mon, options.history)
    registry.remember(model, mon)
    return mon


ATTACH_KEYWORDS = tuple(inspect.signature(attach).parameters)  # what a misspelled keyword is matched against


class AttachedTwiceWarning(UserWarning):
    """attach() on a model that has a monitor attached already."""
