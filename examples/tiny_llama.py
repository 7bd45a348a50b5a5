"""The Llama-shaped transformer the examples train (checkpoint names as in HF), and its toy
next-token task. Sizes are parameters: examples/train_publish.py uses the defaults,
scripts/adamw_series.py wider ones."""

import torch
from torch import nn
from torch.nn import functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class Block(nn.Module):
    def __init__(self, dim, heads, ffn):
        super().__init__()
        self.heads = heads
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(dim), RMSNorm(dim)
        self.self_attn = nn.ModuleDict({n: nn.Linear(dim, dim, bias=False) for n in ("q_proj", "k_proj", "v_proj", "o_proj")})
        self.mlp = nn.ModuleDict({"gate_proj": nn.Linear(dim, ffn, bias=False), "up_proj": nn.Linear(dim, ffn, bias=False),
                                  "down_proj": nn.Linear(ffn, dim, bias=False)})

    def forward(self, x):
        b, t, d = x.shape
        h = self.input_layernorm(x)
        q, k, v = (self.self_attn[n](h).view(b, t, self.heads, -1).transpose(1, 2) for n in ("q_proj", "k_proj", "v_proj"))
        scores = (q @ k.transpose(-1, -2)) / (q.shape[-1] ** 0.5)
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        x = x + self.self_attn["o_proj"]((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d))
        h = self.post_attention_layernorm(x)
        return x + self.mlp["down_proj"](F.silu(self.mlp["gate_proj"](h)) * self.mlp["up_proj"](h))


class TinyLlama(nn.Module):
    def __init__(self, vocab=512, dim=128, layers=2, heads=4, ffn=344):
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(vocab, dim)
        self.model.layers = nn.ModuleList(Block(dim, heads, ffn) for _ in range(layers))
        self.model.norm = RMSNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        x = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            x = layer(x)
        return self.lm_head(self.model.norm(x))


def batch(vocab, generator, size=16, length=32):
    """Sequences where each token is the previous one plus a per-sequence stride."""
    start = torch.randint(0, vocab, (size, 1), generator=generator)
    stride = torch.randint(1, 4, (size, 1), generator=generator)
    return (start + stride * torch.arange(length + 1)) % vocab
