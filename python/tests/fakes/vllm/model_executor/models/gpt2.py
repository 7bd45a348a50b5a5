"""Stand-in for vllm/model_executor/models/gpt2.py at vLLM commit
017689429418547490506c3bf52419a806c115d7, written from ``GPT2LMHeadModel.load_weights`` and the
layers it builds: ``lm_head.weight`` is skipped (tied to ``transformer.wte``), as are the
``.attn.bias`` / ``.attn.masked_bias`` masks; names get the ``transformer.`` prefix; every
``.weight`` of ``c_attn``, ``c_proj`` and ``c_fc`` is transposed (Hugging Face's Conv1D stores
[in, out]) before its parameter's loader gets it; ``c_attn`` is a QKVParallelLinear loaded without
a shard id (the fused q/k/v are split by the total sizes), ``attn.c_proj`` and ``mlp.c_proj``
RowParallelLinear, ``mlp.c_fc`` ColumnParallelLinear, ``wte`` a VocabParallelEmbedding, ``wpe`` and
the LayerNorms plain torch modules (default loader). Tensor-parallel rank and size are given (see
linear.py); no forward.
"""
from dataclasses import dataclass

import torch
from torch import nn

from vllm.model_executor.layers.linear import ColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
from vllm.model_executor.model_loader.weight_utils import default_weight_loader


@dataclass
class GPT2Config:
    n_embd: int = 64
    n_head: int = 4
    n_layer: int = 2
    vocab_size: int = 250
    n_positions: int = 32


def _named_parameters_with_duplicates(module: nn.Module) -> dict:
    """named_parameters(remove_duplicate=False), which torch before 2.0 lacks."""
    try:
        return dict(module.named_parameters(remove_duplicate=False))
    except TypeError:
        out = {}
        for prefix, m in module.named_modules(remove_duplicate=False):
            for name, p in m.named_parameters(recurse=False):
                out[f"{prefix}.{name}" if prefix else name] = p
        return out


class GPT2Block(nn.Module):
    def __init__(self, c: GPT2Config, dtype, tp_rank, tp_size):
        super().__init__()
        tp = dict(tp_rank=tp_rank, tp_size=tp_size)
        self.ln_1 = nn.LayerNorm(c.n_embd, dtype=dtype)
        self.attn = nn.Module()
        self.attn.c_attn = QKVParallelLinear(c.n_embd, c.n_embd // c.n_head, c.n_head, bias=True, params_dtype=dtype, **tp)
        self.attn.c_proj = RowParallelLinear(c.n_embd, c.n_embd, bias=True, params_dtype=dtype, **tp)
        self.ln_2 = nn.LayerNorm(c.n_embd, dtype=dtype)
        self.mlp = nn.Module()
        self.mlp.c_fc = ColumnParallelLinear(c.n_embd, 4 * c.n_embd, bias=True, params_dtype=dtype, **tp)
        self.mlp.c_proj = RowParallelLinear(4 * c.n_embd, c.n_embd, bias=True, params_dtype=dtype, **tp)


class GPT2LMHeadModel(nn.Module):
    def __init__(self, config: GPT2Config = GPT2Config(), dtype=torch.bfloat16, *, tp_rank: int = 0, tp_size: int = 1):
        super().__init__()
        self.config = config
        self.transformer = nn.Module()
        self.transformer.wte = VocabParallelEmbedding(config.vocab_size, config.n_embd, dtype, tp_rank=tp_rank, tp_size=tp_size)
        self.transformer.wpe = nn.Embedding(config.n_positions, config.n_embd, dtype=dtype)
        self.transformer.h = nn.ModuleList(GPT2Block(config, dtype, tp_rank, tp_size) for _ in range(config.n_layer))
        self.transformer.ln_f = nn.LayerNorm(config.n_embd, dtype=dtype)
        self.lm_head = self.transformer.wte
        for p in self.parameters():
            p.requires_grad_(False)

    def load_weights(self, weights):
        params_dict = _named_parameters_with_duplicates(self)
        for name, loaded_weight in weights:
            if "lm_head.weight" in name:
                continue
            if ".attn.bias" in name or ".attn.masked_bias" in name:
                continue
            if not name.startswith("transformer."):
                name = "transformer." + name
            param = params_dict[name]
            for conv1d_weight_name in ["c_attn", "c_proj", "c_fc"]:
                if conv1d_weight_name not in name:
                    continue
                if not name.endswith(".weight"):
                    continue
                loaded_weight = loaded_weight.t()
            getattr(param, "weight_loader", default_weight_loader)(param, loaded_weight)

