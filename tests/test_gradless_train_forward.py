"""A forward of the model in training mode without grad (Hugging Face generate() or a sampling pass left in train mode)
is a train step by README's rule, and its values go to the train statistics: one warning says so and what to do.
No warning for the loops where it is meant or harmless: validation in eval mode, train steps, a root checkpointed
whole (use_reentrant=True runs its forward without grad), hookstats.summary()."""
import warnings

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import hookstats

SAID = "ran a forward in training mode under torch.no_grad()"


class TokenNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.head = nn.Embedding(16, 8), nn.Linear(8, 16)

    def forward(self, input_ids):
        return self.head(self.emb(input_ids))


def told(loop, **kw):
    torch.manual_seed(0)
    model = TokenNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with hookstats.attach(model, **kw) as mon:
            loop(model, opt, mon)
    return [str(w.message) for w in caught if SAID in str(w.message)]


def train_step(model, opt):
    model(input_ids=torch.randint(0, 16, (2, 5))).square().mean().backward()
    opt.step()
    opt.zero_grad()


def sample(model):
    with torch.no_grad():
        ids = torch.randint(0, 16, (1, 2))
        for _ in range(3):  # a greedy decode, as generate() runs it
            ids = torch.cat([ids, model(input_ids=ids)[:, -1:].argmax(-1)], 1)


@pytest.mark.parametrize("steps", ["forward", "manual"])
def test_sampling_in_train_mode_is_said_once(steps):
    def loop(model, opt, mon):
        for _ in range(3):
            train_step(model, opt)
            sample(model)
            if steps == "manual":
                mon.step()

    said = told(loop, steps=steps)
    assert len(said) == 1 and "model.eval()" in said[0]
    assert ("counts as a train step" in said[0]) == (steps == "forward")


def test_no_warning_for_validation_train_steps_checkpointing_or_summary():
    def loop(model, opt, mon):
        for _ in range(2):
            train_step(model, opt)
            model.eval()
            sample(model)
            with torch.inference_mode():
                model(input_ids=torch.randint(0, 16, (2, 5)))
            model.train()
        hookstats.summary(model, torch.randint(0, 16, (2, 5)), monitor=mon)

    assert told(loop, eval=True) == []

    def update_bn_paused(model, opt, mon):  # a pass that needs train mode, kept out of the statistics
        train_step(model, opt)
        mon.step()
        mon.pause()
        sample(model)
        mon.resume()

    assert told(update_bn_paused, steps="manual") == []

    class Whole(nn.Module):  # a root whose forward reentrant checkpointing runs without grad
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(x)

    model = Whole()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with hookstats.attach(model):
            for _ in range(2):
                checkpoint(model, torch.randn(3, 4, requires_grad=True), use_reentrant=True).sum().backward()
    assert not [w for w in caught if SAID in str(w.message)]


def test_hugging_face_generate_left_in_train_mode_is_said():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with hookstats.attach(model):
            model.generate(torch.randint(1, 32, (1, 3)), attention_mask=torch.ones(1, 3, dtype=torch.long),
                           max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert len([w for w in caught if SAID in str(w.message)]) == 1
