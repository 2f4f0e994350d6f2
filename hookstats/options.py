"""attach()'s keywords, parsed once: AttachOptions (checked, one clear error each; the monitor, its hooks and its
framework adapter read it) and attach_config (its StatsConfig, from config= or the fields as keywords)."""
import dataclasses

from .checks import check_arg, check_count, did_you_mean
from .config import StatsConfig, hist_every_for


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


def attach_config(config, config_kwargs, log_every=None, every=1, keywords=()):
    """attach()'s StatsConfig: `config` or its fields as keywords (one clear error each; an unknown keyword a
    TypeError naming the closest of `keywords`, attach()'s own, and the fields). Without hist_every, a history
    (log_every given) gets hist_every_for(log_every, every): each logging window holds a histogram step."""
    if config is not None and not isinstance(config, StatsConfig):
        raise ValueError(f"config must be a hookstats.StatsConfig (or pass its fields as keywords: "
                         f"attach(model, nbins=..., lo=...)), got {type(config).__name__}")
    if config is not None and config_kwargs:
        raise ValueError("pass either config= or its fields as keywords, not both")
    if config is not None:
        return config
    fields = [f.name for f in dataclasses.fields(StatsConfig)]
    unknown = sorted(set(config_kwargs) - set(fields))
    if unknown:
        raise TypeError("; ".join(f"attach() got an unexpected keyword argument {k!r}"
                                  + did_you_mean(k, [*keywords, *fields]) for k in unknown))
    if log_every is not None and config_kwargs.get("hist_every") is None:
        config_kwargs = {**config_kwargs, "hist_every": hist_every_for(log_every, check_count("every", every))}
    return StatsConfig(**config_kwargs)
