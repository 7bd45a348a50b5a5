"""A Llama-shaped model as vLLM and SGLang hold it, for the adapter tests.

Checkpoint (HF) names come in; the model's parameters are fused and sliced the way vLLM's
loaders do it (vllm/model_executor/models/llama.py, ``LlamaForCausalLM.load_weights`` with its
``stacked_params_mapping``): q/k/v into ``qkv_proj``, gate/up into ``gate_up_proj``, column-parallel
layers keep this rank's rows, row-parallel layers this rank's columns, the vocabulary is split by
rows, norms are whole on every rank.
"""

from __future__ import annotations

import torch
from torch import nn

HIDDEN, HEADS, KV_HEADS, FFN, VOCAB, LAYERS = 64, 4, 2, 128, 256, 2
HEAD_DIM = HIDDEN // HEADS


def hf_state_dict(seed: int = 0, dtype=torch.bfloat16) -> dict[str, torch.Tensor]:
    """A checkpoint in HF names."""
    g = torch.Generator().manual_seed(seed)

    def w(*shape):
        return (torch.randn(*shape, generator=g) * 0.05).to(dtype)

    sd = {"model.embed_tokens.weight": w(VOCAB, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        sd[p + "self_attn.q_proj.weight"] = w(HEADS * HEAD_DIM, HIDDEN)
        sd[p + "self_attn.k_proj.weight"] = w(KV_HEADS * HEAD_DIM, HIDDEN)
        sd[p + "self_attn.v_proj.weight"] = w(KV_HEADS * HEAD_DIM, HIDDEN)
        sd[p + "self_attn.o_proj.weight"] = w(HIDDEN, HEADS * HEAD_DIM)
        sd[p + "mlp.gate_proj.weight"] = w(FFN, HIDDEN)
        sd[p + "mlp.up_proj.weight"] = w(FFN, HIDDEN)
        sd[p + "mlp.down_proj.weight"] = w(HIDDEN, FFN)
        sd[p + "input_layernorm.weight"] = (1 + w(HIDDEN).float()).to(dtype)
        sd[p + "post_attention_layernorm.weight"] = (1 + w(HIDDEN).float()).to(dtype)
    sd["model.norm.weight"] = (1 + w(HIDDEN).float()).to(dtype)
    sd["lm_head.weight"] = w(VOCAB, HIDDEN)
    return sd


def step(sd: dict[str, torch.Tensor], seed: int, fraction: float = 0.02) -> None:
    """One training step's worth of change: about `fraction` of the values move by one ulp."""
    g = torch.Generator().manual_seed(seed)
    for t in sd.values():
        flat = t.view(-1).view(torch.int16)
        idx = torch.randint(0, flat.numel(), (max(1, int(flat.numel() * fraction)),), generator=g)
        flat[idx] += 1


# Fused parameter <- (checkpoint shard, its index among the fused rows).
STACKED = [("qkv_proj", "q_proj", 0), ("qkv_proj", "k_proj", 1), ("qkv_proj", "v_proj", 2),
           ("gate_up_proj", "gate_proj", 0), ("gate_up_proj", "up_proj", 1)]


class FakeLlama(nn.Module):
    """One tensor-parallel rank of the model, parameters in vLLM's names and layout."""

    def __init__(self, tp_size: int = 1, tp_rank: int = 0, dtype=torch.bfloat16):
        super().__init__()
        self.tp_size, self.tp_rank = tp_size, tp_rank
        self.load_calls = 0

        def p(*shape):
            return nn.Parameter(torch.zeros(*shape, dtype=dtype), requires_grad=False)

        q, kv = HEADS * HEAD_DIM // tp_size, KV_HEADS * HEAD_DIM // tp_size
        self.shard_rows = {"q_proj": (0, q), "k_proj": (q, kv), "v_proj": (q + kv, kv), "gate_proj": (0, FFN // tp_size),
                           "up_proj": (FFN // tp_size, FFN // tp_size)}
        params = {"model.embed_tokens.weight": p(VOCAB // tp_size, HIDDEN), "model.norm.weight": p(HIDDEN),
                  "lm_head.weight": p(VOCAB // tp_size, HIDDEN)}
        for i in range(LAYERS):
            pre = f"model.layers.{i}."
            params[pre + "self_attn.qkv_proj.weight"] = p(q + 2 * kv, HIDDEN)
            params[pre + "self_attn.o_proj.weight"] = p(HIDDEN, HEADS * HEAD_DIM // tp_size)
            params[pre + "mlp.gate_up_proj.weight"] = p(2 * FFN // tp_size, HIDDEN)
            params[pre + "mlp.down_proj.weight"] = p(HIDDEN, FFN // tp_size)
            params[pre + "input_layernorm.weight"] = p(HIDDEN)
            params[pre + "post_attention_layernorm.weight"] = p(HIDDEN)
        self._names = {}
        for name, param in params.items():
            attr = name.replace(".", "__")
            self.register_parameter(attr, param)
            self._names[attr] = name

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        for attr, param in super().named_parameters(prefix, recurse):
            yield self._names[attr], param

    def param(self, name: str) -> nn.Parameter:
        return getattr(self, name.replace(".", "__"))

    def _slice(self, name: str, w: torch.Tensor) -> torch.Tensor:
        """This rank's part of a whole checkpoint tensor."""
        if self.tp_size == 1 or "norm" in name:
            return w
        if "o_proj" in name or "down_proj" in name:  # row parallel: split the input dimension
            n = w.shape[1] // self.tp_size
            return w[:, self.tp_rank * n:(self.tp_rank + 1) * n]
        n = w.shape[0] // self.tp_size  # column parallel and vocabulary parallel
        return w[self.tp_rank * n:(self.tp_rank + 1) * n]

    def load_weights(self, weights) -> set[str]:
        """vLLM's contract: (checkpoint name, whole tensor) pairs in, the loaded parameter names out."""
        self.load_calls += 1
        loaded = set()
        with torch.no_grad():
            for name, w in weights:
                for fused, shard, _ in STACKED:
                    if shard in name:
                        target = name.replace(shard, fused)
                        start, rows = self.shard_rows[shard]
                        self.param(target)[start:start + rows].copy_(self._slice(name, w))
                        loaded.add(target)
                        break
                else:
                    if name not in self._names.values():
                        raise KeyError(f"unexpected checkpoint tensor {name}")
                    self.param(name).copy_(self._slice(name, w))
                    loaded.add(name)
        return loaded

    def expected(self, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What every parameter must hold after loading checkpoint `sd` (built independently of
        load_weights: concatenation of this rank's slices)."""
        out = {}
        for name in self._names.values():
            shards = [(fused, shard) for fused, shard, _ in STACKED if fused in name]  # in row order
            if shards:
                out[name] = torch.cat([self._slice(name, sd[name.replace(fused, shard)]) for fused, shard in shards], 0)
            else:
                out[name] = self._slice(name, sd[name])
        return out


def same_bits(model: FakeLlama, sd: dict[str, torch.Tensor]) -> list[str]:
    """Parameter names whose bits differ from what checkpoint `sd` gives."""
    want = model.expected(sd)
    return [name for name, p in model.named_parameters()
            if not torch.equal(p.detach().view(torch.int16), want[name].contiguous().view(torch.int16))]
