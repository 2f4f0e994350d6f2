"""The architecture zoo of tests/test_zoo.py: tiny real models (Hugging Face ones built from configs, no
download), each with a batch maker and a loss, and a switch for activation checkpointing."""
import dataclasses
import os
from typing import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

VOCAB, SEQ, BATCH, D = 64, 8, 2, 32


@dataclasses.dataclass
class Arch:
    name: str
    build: Callable  # (dropout) -> model
    batch: Callable  # (generator) -> kwargs of the model's forward
    loss: Callable  # (model output, batch) -> scalar loss
    hf: bool = False  # checkpointing through activation_checkpointing_enable()
    attach: dict = dataclasses.field(default_factory=dict)  # extra attach() arguments it needs


def ids_batch(g, mask=False, labels=True):
    ids = torch.randint(1, VOCAB, (BATCH, SEQ), generator=g)
    out = {"input_ids": ids}
    if mask:
        m = torch.ones(BATCH, SEQ, dtype=torch.long)
        m[1, SEQ - 3:] = 0  # a padded sequence
        out["attention_mask"] = m
    if labels:
        out["labels"] = ids.clone()
    return out


def hf_loss(out, batch):
    return out.loss


# ---- Hugging Face models from tiny configs ----
def gpt2(dropout):
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=D, n_layer=2, n_head=2,
                                      resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout, use_cache=False,
                                      bos_token_id=0, eos_token_id=0))


def bert(dropout):
    from transformers import BertConfig, BertForSequenceClassification
    return BertForSequenceClassification(BertConfig(
        vocab_size=VOCAB, hidden_size=D, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=16, num_labels=3, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout))


def bert_batch(g):
    b = ids_batch(g, mask=True, labels=False)
    b["labels"] = torch.randint(0, 3, (BATCH,), generator=g)
    return b


def t5(dropout):
    from transformers import T5Config, T5ForConditionalGeneration
    return T5ForConditionalGeneration(T5Config(
        vocab_size=VOCAB, d_model=D, d_kv=16, d_ff=64, num_layers=2, num_heads=2, dropout_rate=dropout,
        decoder_start_token_id=0, pad_token_id=0, use_cache=False))


def llama(dropout):
    from transformers import LlamaConfig, LlamaForCausalLM
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=D, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=16, attention_dropout=dropout, use_cache=False))


def vit(dropout):
    from transformers import ViTConfig, ViTForImageClassification
    return ViTForImageClassification(ViTConfig(
        image_size=16, patch_size=4, num_channels=3, hidden_size=D, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, num_labels=3, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout))


def image_batch(g, channels=3, size=16):
    return {"pixel_values": torch.randn(BATCH, channels, size, size, generator=g),
            "labels": torch.randint(0, 3, (BATCH,), generator=g)}


# ---- plain PyTorch models ----
def maybe_checkpoint(model, fn, *args):
    """model.ckpt: None (off), or use_reentrant of torch.utils.checkpoint."""
    if model.ckpt is None or not model.training:
        return fn(*args)
    return checkpoint(fn, *args, use_reentrant=model.ckpt)


class RNNClassifier(nn.Module):
    """Embedding -> 2-layer LSTM or GRU (initial state passed: the optional `hx` input) -> Linear."""

    def __init__(self, cell, dropout):
        super().__init__()
        self.ckpt = None
        self.emb = nn.Embedding(VOCAB, D)
        self.rnn = cell(D, D, num_layers=2, batch_first=True, dropout=dropout)
        self.head = nn.Linear(D, 3)

    def forward(self, input_ids, labels=None):
        x = self.emb(input_ids)
        h0 = torch.zeros(2, x.shape[0], D)
        hx = (h0, torch.zeros_like(h0)) if isinstance(self.rnn, nn.LSTM) else h0
        out = maybe_checkpoint(self, lambda x: self.rnn(x, hx)[0], x)
        return self.head(out[:, -1])


def cls_batch(g):
    return {"input_ids": torch.randint(1, VOCAB, (BATCH, SEQ), generator=g),
            "labels": torch.randint(0, 3, (BATCH,), generator=g)}


def ce_loss(out, batch):
    return F.cross_entropy(out, batch["labels"])


class EncoderClassifier(nn.Module):
    """nn.TransformerEncoder with a padding mask (its eval fast path runs on nested tensors)."""

    def __init__(self, dropout):
        super().__init__()
        self.ckpt = None
        self.emb = nn.Embedding(VOCAB, D)
        layer = nn.TransformerEncoderLayer(D, nhead=2, dim_feedforward=64, dropout=dropout, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2)
        self.head = nn.Linear(D, 3)

    def forward(self, input_ids, attention_mask, labels=None):
        x = self.emb(input_ids)
        pad = attention_mask == 0
        for layer in self.encoder.layers if self.ckpt is not None and self.training else ():
            x = maybe_checkpoint(self, lambda x, layer=layer: layer(x, src_key_padding_mask=pad), x)
        if self.ckpt is None or not self.training:
            x = self.encoder(x, src_key_padding_mask=pad)
        return self.head(x[:, 0])


def enc_batch(g):
    b = cls_batch(g)
    b["attention_mask"] = ids_batch(g, mask=True)["attention_mask"]
    return b


class ResBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += x  # ResNet's in-place residual add, on bn2's output
        return self.relu(out)


class CNN(nn.Module):
    """conv-bn-relu(inplace) stem in an nn.Sequential, a ResNet basic block, pooling, linear head."""

    def __init__(self, dropout):
        super().__init__()
        self.ckpt = None
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True))
        self.block = ResBlock(8)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(8, 3)

    def forward(self, pixel_values, labels=None):
        x = self.stem(pixel_values)
        x = maybe_checkpoint(self, self.block, x)  # its input requires grad: reentrant checkpointing works
        return self.head(self.drop(F.adaptive_avg_pool2d(x, 1).flatten(1)))


class MoE(nn.Module):
    """Top-1 mixture of experts whose last expert never gets a token: it is called on an empty batch."""

    def __init__(self, dropout, experts=4):
        super().__init__()
        self.ckpt = None
        self.emb = nn.Embedding(VOCAB, D)
        self.router = nn.Linear(D, experts)
        with torch.no_grad():
            self.router.bias[-1] = -1e4
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(D, 64), nn.GELU(), nn.Linear(64, D))
                                     for _ in range(experts))
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, 3)

    def moe(self, x):
        flat = x.reshape(-1, D)
        gate = self.router(flat).softmax(-1)
        choice = gate.argmax(-1)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            idx = (choice == e).nonzero().squeeze(-1)
            out = out.index_add(0, idx, (expert(flat[idx]) * gate[idx, e:e + 1]).to(out.dtype))
        return x + out.reshape(x.shape)

    def forward(self, input_ids, labels=None):
        x = maybe_checkpoint(self, self.moe, self.emb(input_ids))
        return self.head(self.norm(x).mean(1))


ARCHS = {a.name: a for a in [
    Arch("gpt2", gpt2, lambda g: ids_batch(g), hf_loss, hf=True),
    Arch("bert", bert, bert_batch, hf_loss, hf=True),
    Arch("t5", t5, lambda g: ids_batch(g), hf_loss, hf=True),
    Arch("llama", llama, lambda g: ids_batch(g), hf_loss, hf=True),
    Arch("vit", vit, image_batch, hf_loss, hf=True),
    Arch("lstm", lambda d: RNNClassifier(nn.LSTM, d), cls_batch, ce_loss),
    Arch("gru", lambda d: RNNClassifier(nn.GRU, d), cls_batch, ce_loss),
    # every module, parameterless ones too (the layers' outputs are nested tensors in the eval fast path);
    # not the root, whose target name (":output" or the class name) is not what this test is about
    Arch("encoder", EncoderClassifier, enc_batch, ce_loss, attach={"include_paramless": True, "exclude": [""]}),
    Arch("cnn", CNN, lambda g: image_batch(g, size=8), ce_loss),
    Arch("moe", MoE, cls_batch, ce_loss),
]}


def build(arch, seed=0, dropout=0.1):
    torch.manual_seed(seed)
    return arch.build(dropout)


def set_checkpointing(arch, model, reentrant):
    if arch.hf:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": reentrant})
    else:
        model.ckpt = reentrant
