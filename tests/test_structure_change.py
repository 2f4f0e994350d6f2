"""A model changed after attach (PEFT's LoRA, a new head, weight_norm, a replaced or re-materialized parameter) has
modules and parameters no hook measures: the monitor says so once, naming them, at the first step's end. Wrapping
the model (torch.compile, a DDP-style wrapper, activation checkpointing's wrapper), switching modes, autocast and
an EMA's deepcopy change nothing it hooked, and must not warn."""
import copy
import warnings

import pytest
import torch
from torch import nn

import hookstats

CHANGED = "the model changed after attach"


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def train(model, forward=None, steps=3, **kwargs):
    """Trains `steps` steps through `forward` (default: the model); the structure warnings said meanwhile."""
    forward = model if forward is None else forward
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.01)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        for _ in range(steps):
            out = forward(**kwargs) if kwargs else forward(torch.randn(3, 4))
            loss = out.logits.square().mean() if hasattr(out, "logits") else out.square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
    return [str(w.message) for w in said if CHANGED in str(w.message)]


def test_a_new_head_is_named_and_its_targets_are_missing():
    model = net()
    with hookstats.attach(model) as mon:
        model[2] = nn.Linear(8, 2)
        said = train(model)
        assert "2:output" not in mon.stats() and "0:output" in mon.stats()  # the new head is not measured
    assert len(said) == 1 and "2 (replaced)" in said[0] and "mon.remove()" in said[0]


def test_weight_norm_after_attach_names_its_parameters_with_param_grads_and_is_silent_without():
    model = net()
    with hookstats.attach(model, param_grads=True):
        nn.utils.parametrizations.weight_norm(model[0])
        said = train(model)
    assert len(said) == 1 and "0.parametrizations.weight.original0" in said[0] and "param_grads=True" in said[0]
    model = net()
    with hookstats.attach(model):  # outputs and their gradients: still the same module's, still measured
        nn.utils.parametrizations.weight_norm(model[0])
        assert train(model) == []


@pytest.mark.parametrize("change", ["assign", "load_state_dict_assign"])
def test_replaced_parameter_objects_are_named_with_params(change):
    model = net()
    with hookstats.attach(model, params=True):
        if change == "assign":
            model[0].weight = nn.Parameter(model[0].weight.detach().clone())
        else:
            model.load_state_dict(net().state_dict(), assign=True)
        said = train(model)
    assert len(said) == 1 and "0.weight" in said[0] and "params=True" in said[0]


def test_a_parameter_unfrozen_after_attach_is_named_with_param_grads():
    model = net()
    model[2].requires_grad_(False)
    with hookstats.attach(model, param_grads=True):
        model[2].requires_grad_(True)  # gradual unfreezing: its gradients get no hook
        said = train(model)
    assert len(said) == 1 and "2.weight" in said[0] and "frozen at attach and unfrozen since" in said[0]
    assert "carry no param_grads hook" in said[0] and "after unfreezing" in said[0]


def test_said_once_with_the_first_names():
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(8)])
    with hookstats.attach(model) as mon:
        for i in range(6):
            model[i] = nn.Linear(4, 4)
        said = train(model, steps=25)
        with warnings.catch_warnings(record=True) as more:
            warnings.simplefilter("always")
            mon.stats()
        said += [str(w.message) for w in more if CHANGED in str(w.message)]
    assert len(said) == 1 and "6 modules" in said[0] and "3 (replaced), ..." in said[0]


def tiny_gpt2():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=16, vocab_size=64, n_positions=16)
    return transformers.GPT2LMHeadModel(cfg)


def gpt2_batch():
    return {"input_ids": torch.randint(0, 64, (2, 8))}


def test_peft_lora_after_attach_names_the_lora_modules():
    peft = pytest.importorskip("peft")
    model = tiny_gpt2()
    with hookstats.attach(model, param_grads=True):
        lora = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["c_attn"], fan_in_fan_out=True))
        said = train(model, lora, **gpt2_batch())
    assert len(said) == 1
    assert "transformer.h.0.attn.c_attn.lora_A.default" in said[0]
    assert "parameters that param_grads=True would measure" in said[0]


def test_peft_lora_before_attach_is_silent_and_measures_the_lora_modules():
    peft = pytest.importorskip("peft")
    lora = peft.get_peft_model(tiny_gpt2(), peft.LoraConfig(r=4, target_modules=["c_attn"], fan_in_fan_out=True))
    with hookstats.attach(lora, param_grads=True) as mon:
        assert train(lora, **gpt2_batch()) == []
        grads = mon.stats(kind="param_grad")
    assert any("lora_B.default.weight" in t and grads[t]["count"] > 0 for t in grads)


def test_gpt2_with_gradient_checkpointing_and_eval_passes_is_silent():
    model = tiny_gpt2()
    with hookstats.attach(model, param_grads=True, params=True):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        said = train(model, **gpt2_batch())
        model.eval()
        with torch.no_grad():
            model(**gpt2_batch())
        model.train()
        said += train(model, **gpt2_batch())
    assert said == []


class Wrapper(nn.Module):
    """What DDP does to the module it is given: holds it as .module and calls it."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        return self.module(x)


def test_wrappers_modes_autocast_and_copies_are_silent():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    model = net()
    with hookstats.attach(model, include_paramless=True, param_grads=True, params=True) as mon:
        said = train(model, Wrapper(model))
        model.eval()
        model.train()
        ema = copy.deepcopy(model)  # an EMA's copy: its hooks do nothing, the model is untouched
        with torch.no_grad():
            for e, p in zip(ema.parameters(), model.parameters()):
                e.lerp_(p, 0.1)
        averaged = torch.optim.swa_utils.AveragedModel(model)
        averaged.update_parameters(model)
        model[1] = checkpoint_wrapper(model[1])  # the wrapped ReLU stays hooked
        with torch.autocast("cpu", dtype=torch.bfloat16):
            said += train(model)
        said += train(ema)
        mon.stats()
    assert said == []



def test_torch_compile_is_silent(fresh_dynamo):
    model = net()
    with hookstats.attach(model, param_grads=True):
        said = train(model, torch.compile(model, backend="eager"))
    assert said == []
