"""Stand-in for vllm/model_executor/models/llama.py at vLLM commit
0035bdf2b1ac243ef6f31eef27411b022461df8e, written from ``LlamaForCausalLM.load_weights``:
q/k/v go to ``qkv_proj`` with shard ids "q", "k", "v" and gate/up to ``gate_up_proj`` with 0 and
1 (``stacked_params_mapping``), each through its parameter's ``weight_loader``; every other
tensor through its own loader or ``default_weight_loader``; rotary caches are skipped. The
layers are the tensor-parallel ones of vllm/model_executor/layers (see linear.py for how this
stand-in differs: tp rank and size are given, no forward).
"""
from dataclasses import dataclass

import torch
from torch import nn

from vllm.model_executor.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.model_loader.weight_utils import default_weight_loader


@dataclass
class LlamaConfig:
    hidden_size: int = 64
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 128
    vocab_size: int = 250  # not a multiple of 64: padded
    num_hidden_layers: int = 2


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(hidden_size, dtype=dtype), requires_grad=False)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, c: LlamaConfig, dtype, tp_rank, tp_size, quant_method):
        super().__init__()
        head_dim = c.hidden_size // c.num_attention_heads
        tp = dict(tp_rank=tp_rank, tp_size=tp_size, quant_method=quant_method)
        self.self_attn = nn.Module()
        self.self_attn.qkv_proj = QKVParallelLinear(c.hidden_size, head_dim, c.num_attention_heads, c.num_key_value_heads,
                                                    bias=False, params_dtype=dtype, **tp)
        self.self_attn.o_proj = RowParallelLinear(c.num_attention_heads * head_dim, c.hidden_size, bias=False, params_dtype=dtype, **tp)
        self.mlp = nn.Module()
        self.mlp.gate_up_proj = MergedColumnParallelLinear(c.hidden_size, [c.intermediate_size] * 2, bias=False, params_dtype=dtype, **tp)
        self.mlp.down_proj = RowParallelLinear(c.intermediate_size, c.hidden_size, bias=False, params_dtype=dtype, **tp)
        self.input_layernorm = RMSNorm(c.hidden_size, dtype)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, dtype)


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: LlamaConfig = LlamaConfig(), dtype=torch.bfloat16, *, tp_rank: int = 0, tp_size: int = 1,
                 quant_method=None):
        super().__init__()
        self.config = config
        self.model = nn.Module()
        self.model.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, dtype, tp_rank=tp_rank, tp_size=tp_size)
        self.model.layers = nn.ModuleList(LlamaDecoderLayer(config, dtype, tp_rank, tp_size, quant_method)
                                          for _ in range(config.num_hidden_layers))
        self.model.norm = RMSNorm(config.hidden_size, dtype)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, dtype, tp_rank=tp_rank, tp_size=tp_size)

    def load_weights(self, weights):
        stacked_params_mapping = [
            (".qkv_proj", ".q_proj", "q"),
            (".qkv_proj", ".k_proj", "k"),
            (".qkv_proj", ".v_proj", "v"),
            (".gate_up_proj", ".gate_proj", 0),
            (".gate_up_proj", ".up_proj", 1),
        ]
        params_dict = dict(self.named_parameters())
        for name, loaded_weight in weights:
            if "rotary_emb.inv_freq" in name or "rotary_emb.cos_cached" in name or "rotary_emb.sin_cached" in name:
                continue
            for param_name, weight_name, shard_id in stacked_params_mapping:
                if weight_name not in name:
                    continue
                name = name.replace(weight_name, param_name)
                if name.endswith(".bias") and name not in params_dict:
                    continue
                param = params_dict[name]
                param.weight_loader(param, loaded_weight, shard_id)
                break
            else:
                if name.endswith(".bias") and name not in params_dict:
                    continue
                param = params_dict[name]
                getattr(param, "weight_loader", default_weight_loader)(param, loaded_weight)

