"""AttachOptions: attach()'s keywords, checked once (one clear error each) and kept as one object that the monitor,
its hooks and its framework adapter read."""
import dataclasses

from .config import StatsConfig, attach_config, check_arg


@dataclasses.dataclass(frozen=True)
class AttachOptions:
    config: StatsConfig
    modules: object = None
    types: object = None
    exclude: object = None
    include_paramless: bool = False
    every: int = 1
    eval: bool = False
    steps: str = "forward"
    inputs: bool = False
    outputs: bool = True
    grads: bool = True
    input_grads: bool = False
    param_grads: bool = False
    params: bool = False
    separate_calls: bool = False
    rank_zero_only: bool = True
    start_step: int = 0
    history: dict = None  # History's keywords (history.history_options), None when no history is kept
    optimizer: object = None  # Paddle: the optimizer whose step() measures param_grads

    def saved(self):
        """The options a checkpoint records and load_state_dict() compares (checkpoint.py)."""
        return dict(eval=self.eval, inputs=self.inputs, outputs=self.outputs, grads=self.grads,
                    input_grads=self.input_grads, param_grads=self.param_grads, separate_calls=self.separate_calls,
                    steps=self.steps)


def attach_options(adapter, signature, *, history, log_every, keep, sinks, alerts, clip_norm, eval, config,
                   config_kwargs, **keywords):
    """AttachOptions from attach()'s keywords and its StatsConfig fields (config_kwargs): what the adapter refuses
    first, then the history, the flags, start_step, what the adapter cannot do with them, and the StatsConfig.
    signature: attach()'s parameter names, which a misspelled keyword is matched against."""
    from .history import history_options
    for name, why in adapter.refused.items():
        if keywords.get(name):
            raise ValueError(f"attach: {name}= {why}")
    config_kwargs, keywords["clip_norm"] = dict(config_kwargs), clip_norm
    for name in adapter.foreign:  # not this framework's keyword: given, an unknown one
        if (value := keywords.pop(name)) is not None:
            config_kwargs[name] = value
    clip_norm = keywords.pop("clip_norm", None)
    history = history_options(history, log_every, keep, sinks, alerts, clip_norm)  # History's keywords, or None
    if clip_norm is not None and keywords["param_grads"] is not True:
        raise ValueError("clip_norm is told against the parameter gradients' norms: attach(..., param_grads=True)")
    eval = history is not None if eval is None else eval  # validation passes recorded wherever records go
    flags = dict(include_paramless=keywords["include_paramless"], eval=eval, **{n: keywords[n] for n in FLAGS})
    for name, v in flags.items():
        check_arg(name, v, bool)
    keywords["start_step"] = check_arg("start_step", keywords["start_step"], int, lo=0)
    adapter.check_options(dict(keywords, eval=eval))
    known = [k for k in signature if k not in adapter.refused and k not in adapter.foreign]
    config = attach_config(config, config_kwargs, None if history is None else history["log_every"],
                           keywords["every"], keywords=tuple(known))
    options = AttachOptions(config=config, history=history, eval=eval, **keywords)
    if history is not None and options.rank_zero_only:
        history["sinks"] = adapter.rank_zero_sinks(history["sinks"])
    return options


# the bool keywords checked after include_paramless and eval, in attach()'s order
FLAGS = ("inputs", "outputs", "grads", "input_grads", "param_grads", "params", "separate_calls", "rank_zero_only")
