"""Models for `python -m hookstats plan`, built from configs on the meta device (nothing is downloaded or
allocated): GPT-2 124M, Llama-7B- and Llama-70B-shaped decoders (Llama 2's published shapes), or any local
Hugging Face config.json. Each comes with token inputs and labels, so the plan backpropagates the model's loss."""
import contextlib
import json
from pathlib import Path

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

PRESETS = {
    "gpt2": {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257,
             "n_positions": 1024},
    "llama-7b": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                 "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000,
                 "max_position_embeddings": 4096},
    "llama-70b": {"model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                  "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 32000,
                  "max_position_embeddings": 4096},
}
DEFAULT_SEQ = 1024


def load_config(name_or_path):
    """A preset's config dict, or a local config.json's."""
    if name_or_path in PRESETS:
        return dict(PRESETS[name_or_path])
    path = Path(name_or_path)
    if not path.is_file():
        raise ValueError(f"{name_or_path!r} is neither a preset ({', '.join(PRESETS)}) nor a config file")
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not JSON: {e}") from None
    if not isinstance(cfg, dict) or "model_type" not in cfg:
        raise ValueError(f"{path} has no 'model_type': not a Hugging Face model config")
    return cfg


@contextlib.contextmanager
def quiet_transformers():
    """transformers' logging at errors only while the block runs (its notices are for its own users), as before
    after; nothing when transformers is not installed."""
    try:
        from transformers.utils import logging
    except ImportError:
        yield
        return
    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


def build(name_or_path, batch=1, seq=None, dtype="bf16"):
    """(model on the meta device in `dtype`, positional inputs, keyword inputs) for one training step."""
    from ..extras import require
    transformers = require("transformers", "hookstats plan (model presets and configs)")
    AutoConfig, AutoModel, AutoModelForCausalLM = (transformers.AutoConfig, transformers.AutoModel,
                                                   transformers.AutoModelForCausalLM)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    cfg = load_config(name_or_path)
    try:
        config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    except Exception as e:  # ValueError, TypeError, huggingface_hub's validation errors: one line, no traceback
        raise ValueError(f"{name_or_path}: transformers cannot build this config: {_first_line(e)}") from None
    max_len = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    seq = seq or min(DEFAULT_SEQ, max_len or DEFAULT_SEQ)
    if max_len and seq > max_len:
        raise ValueError(f"--seq {seq} is longer than the model's {max_len} positions")
    with torch.device("meta"):
        try:
            try:
                model, causal = _from_config(AutoModelForCausalLM, config, DTYPES[dtype]), True
            except ValueError:  # not a causal LM: the bare model
                model, causal = _from_config(AutoModel, config, DTYPES[dtype]), False
        except Exception as e:  # a field of the wrong type or value reaches the model's code
            raise ValueError(f"{name_or_path}: transformers cannot build a model from this config: "
                             f"{_first_line(e)}") from None
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    return model, (ids,), ({"labels": ids, "use_cache": False} if causal else {"use_cache": False})


def _first_line(e):
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return f"{type(e).__name__}: " + " ".join(lines[:2]) if lines else type(e).__name__


def _from_config(auto, config, dtype):
    try:
        return auto.from_config(config, dtype=dtype)
    except TypeError:  # transformers 4.x calls it torch_dtype
        return auto.from_config(config, torch_dtype=dtype)
