"""The benchmark workloads: a small CNN, a small decoder-only transformer and a stack of N small layers,
each with one fixed batch and an SGD training step."""
import re

import torch
from torch import nn
from torch.nn import functional as F

WORKLOADS = ("cnn", "transformer", "stackN")


class SmallCNN(nn.Module):
    """6 x conv/bn/relu (stride 2 every other block), pooled, one linear head: 13 modules with params."""

    def __init__(self, width=(32, 32, 64, 64, 128, 128), classes=10):
        super().__init__()
        layers, c = [], 3
        for k, w in enumerate(width):
            layers += [nn.Conv2d(c, w, 3, stride=1 + k % 2, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU()]
            c = w
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(c, classes)

    def forward(self, x):
        return self.head(self.features(x).mean((2, 3)))


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.qkv, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln2, self.fc1, self.fc2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class SmallTransformer(nn.Module):
    """Decoder-only: embedding, `blocks` pre-norm blocks of width d, final norm and vocabulary head."""

    def __init__(self, blocks=4, d=256, heads=4, vocab=1000, seq=128):
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.zeros(seq, d))
        self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(blocks)])
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, idx):
        return self.head(self.ln(self.blocks(self.emb(idx) + self.pos[: idx.shape[1]])))


class LayerStack(nn.Module):
    """`n` small Linear(width, width) + ReLU layers: per-call fixed costs dominate."""

    def __init__(self, n, width=32):
        super().__init__()
        self.layers = nn.Sequential(*[m for _ in range(n) for m in (nn.Linear(width, width), nn.ReLU())])

    def forward(self, x):
        return self.layers(x)


def check_workload(name):
    """name if it is a workload (cnn, transformer, stackN with N >= 1), else ValueError naming the choices."""
    m = re.fullmatch(r"stack(\d+)", name)
    if name in ("cnn", "transformer") or (m and int(m.group(1)) >= 1):
        return name
    raise ValueError(f"unknown workload {name!r}: cnn, transformer or stackN (N >= 1 layers)")


def make_workload(name, seed=0, device="cpu"):
    """(model, step): step() runs one SGD training step on a fixed batch and returns nothing."""
    torch.manual_seed(seed)
    check_workload(name)
    if name == "cnn":
        model, x, y = SmallCNN(), torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,))
    elif name == "transformer":
        model, x = SmallTransformer(), torch.randint(0, 1000, (16, 128))
        y = torch.randint(0, 1000, (16 * 128,))
    else:
        model, x, y = LayerStack(int(name[5:])), torch.randn(16, 32), torch.randint(0, 32, (16,))
    model, x, y = model.to(device), x.to(device), y.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def step():
        out = model(x)
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    model.train()
    return model, step
