"""Stand-in for vllm/model_executor/layers/linear.py at vLLM commit
0036d38de46c5d48fdedeb658dedc0fc0f95677d, written from the weight loaders of that file:
ColumnParallelLinear narrows the output dimension at tp_rank * shard; MergedColumnParallelLinear
puts shard i at sum(output_sizes[:i]) // tp and takes its rank's rows of it (loaded whole when
no shard id is given); QKVParallelLinear puts q, k, v at their offsets, k and v from
tp_rank // num_kv_head_replicas (a fused checkpoint tensor, shard id None, is split by the total
sizes); RowParallelLinear narrows the input dimension, and its bias is copied whole.

Differences from upstream: tensor-parallel rank and size are constructor arguments (upstream
reads them from vllm.distributed.parallel_state), so that several ranks can live in one test
process; quantization is a ``quant_method`` object with ``process_weights_after_loading`` (no
packed or block-scale parameters); no forward.
"""
from typing import Optional

import torch
from torch.nn import Parameter


def divide(a: int, b: int) -> int:
    assert a % b == 0, f"{a} is not divisible by {b}"
    return a // b


def set_weight_attrs(weight: torch.Tensor, attrs: dict) -> None:
    for key, value in attrs.items():
        setattr(weight, key, value)


class LinearBase(torch.nn.Module):
    def __init__(self, input_size, output_size, bias, params_dtype, tp_rank, tp_size, quant_method=None):
        super().__init__()
        self.input_size, self.output_size = input_size, output_size
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.params_dtype = params_dtype or torch.get_default_dtype()
        self.quant_method = quant_method


class ColumnParallelLinear(LinearBase):
    def __init__(self, input_size: int, output_size: int, bias: bool = True, params_dtype=None, *, tp_rank: int = 0,
                 tp_size: int = 1, quant_method=None):
        super().__init__(input_size, output_size, bias, params_dtype, tp_rank, tp_size, quant_method)
        self.input_size_per_partition = input_size
        self.output_size_per_partition = divide(output_size, tp_size)
        self.weight = Parameter(torch.empty(self.output_size_per_partition, input_size, dtype=self.params_dtype), requires_grad=False)
        set_weight_attrs(self.weight, {"input_dim": 1, "output_dim": 0, "weight_loader": self.weight_loader})
        if bias:
            self.bias = Parameter(torch.empty(self.output_size_per_partition, dtype=self.params_dtype), requires_grad=False)
            set_weight_attrs(self.bias, {"output_dim": 0, "weight_loader": self.weight_loader})
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: Parameter, loaded_weight: torch.Tensor):
        output_dim = getattr(param, "output_dim", None)
        param_data = param.data
        if output_dim is not None:
            shard_size = param_data.shape[output_dim]
            start_idx = self.tp_rank * shard_size
            loaded_weight = loaded_weight.narrow(output_dim, start_idx, shard_size)
        if len(loaded_weight.shape) == 0:
            loaded_weight = loaded_weight.reshape(1)
        assert param_data.shape == loaded_weight.shape
        param_data.copy_(loaded_weight)


class MergedColumnParallelLinear(ColumnParallelLinear):
    def __init__(self, input_size: int, output_sizes: list, bias: bool = True, params_dtype=None, *, tp_rank: int = 0,
                 tp_size: int = 1, quant_method=None):
        self.output_sizes = output_sizes
        super().__init__(input_size, sum(output_sizes), bias, params_dtype, tp_rank=tp_rank, tp_size=tp_size,
                         quant_method=quant_method)

    def weight_loader(self, param: Parameter, loaded_weight: torch.Tensor, loaded_shard_id: Optional[int] = None):
        param_data = param.data
        output_dim = getattr(param, "output_dim", None)
        if loaded_shard_id is None:
            if output_dim is None:
                assert param_data.shape == loaded_weight.shape
                param_data.copy_(loaded_weight)
                return
            current_shard_offset = 0
            for i, output_size in enumerate(self.output_sizes):
                self.weight_loader(param, loaded_weight.narrow(output_dim, current_shard_offset, output_size), i)
                current_shard_offset += output_size
            return
        assert loaded_shard_id < len(self.output_sizes)
        if output_dim is not None:
            shard_offset = sum(self.output_sizes[:loaded_shard_id]) // self.tp_size
            shard_size = self.output_sizes[loaded_shard_id] // self.tp_size
            param_data = param_data.narrow(output_dim, shard_offset, shard_size)
            start_idx = self.tp_rank * shard_size
            loaded_weight = loaded_weight.narrow(output_dim, start_idx, shard_size)
        assert param_data.shape == loaded_weight.shape
        param_data.copy_(loaded_weight)


class QKVParallelLinear(ColumnParallelLinear):
    def __init__(self, hidden_size: int, head_size: int, total_num_heads: int, total_num_kv_heads: Optional[int] = None,
                 bias: bool = True, params_dtype=None, *, tp_rank: int = 0, tp_size: int = 1, quant_method=None):
        self.hidden_size, self.head_size = hidden_size, head_size
        self.total_num_heads = total_num_heads
        self.total_num_kv_heads = total_num_kv_heads if total_num_kv_heads is not None else total_num_heads
        self.num_heads = divide(self.total_num_heads, tp_size)
        if tp_size >= self.total_num_kv_heads:
            self.num_kv_heads = 1
            self.num_kv_head_replicas = divide(tp_size, self.total_num_kv_heads)
        else:
            self.num_kv_heads = divide(self.total_num_kv_heads, tp_size)
            self.num_kv_head_replicas = 1
        self.output_sizes = [self.num_heads * head_size * tp_size, self.num_kv_heads * head_size * tp_size,
                             self.num_kv_heads * head_size * tp_size]
        super().__init__(hidden_size, sum(self.output_sizes), bias, params_dtype, tp_rank=tp_rank, tp_size=tp_size,
                         quant_method=quant_method)

    def weight_loader(self, param: Parameter, loaded_weight: torch.Tensor, loaded_shard_id: Optional[str] = None):
        if loaded_shard_id not in {"q", "k", "v", None}:
            raise ValueError(f"Shard id for QKVParallelLinear should be 'q', 'k', or 'v', got shard id {loaded_shard_id}.")
        param_data = param.data
        output_dim = getattr(param, "output_dim", None)
        if loaded_shard_id is None:
            if output_dim is None:
                assert param_data.shape == loaded_weight.shape
                param_data.copy_(loaded_weight)
                return
            shard_offsets = [("q", 0, self.total_num_heads * self.head_size),
                             ("k", self.total_num_heads * self.head_size, self.total_num_kv_heads * self.head_size),
                             ("v", (self.total_num_heads + self.total_num_kv_heads) * self.head_size,
                              self.total_num_kv_heads * self.head_size)]
            for shard_id, shard_offset, shard_size in shard_offsets:
                self.weight_loader(param, loaded_weight.narrow(output_dim, shard_offset, shard_size), shard_id)
            return
        if output_dim is not None:
            if loaded_shard_id == "q":
                shard_offset, shard_size = 0, self.num_heads * self.head_size
            elif loaded_shard_id == "k":
                shard_offset, shard_size = self.num_heads * self.head_size, self.num_kv_heads * self.head_size
            else:
                shard_offset, shard_size = (self.num_heads + self.num_kv_heads) * self.head_size, self.num_kv_heads * self.head_size
            param_data = param_data.narrow(output_dim, shard_offset, shard_size)
            shard_rank = self.tp_rank if loaded_shard_id == "q" else self.tp_rank // self.num_kv_head_replicas
            loaded_weight = loaded_weight.narrow(output_dim, shard_rank * shard_size, shard_size)
        assert param_data.shape == loaded_weight.shape
        param_data.copy_(loaded_weight)


class RowParallelLinear(LinearBase):
    def __init__(self, input_size: int, output_size: int, bias: bool = True, params_dtype=None, *, tp_rank: int = 0,
                 tp_size: int = 1, quant_method=None):
        super().__init__(input_size, output_size, bias, params_dtype, tp_rank, tp_size, quant_method)
        self.input_size_per_partition = divide(input_size, tp_size)
        self.weight = Parameter(torch.empty(output_size, self.input_size_per_partition, dtype=self.params_dtype), requires_grad=False)
        set_weight_attrs(self.weight, {"input_dim": 1, "output_dim": 0, "weight_loader": self.weight_loader})
        if bias:
            self.bias = Parameter(torch.empty(output_size, dtype=self.params_dtype), requires_grad=False)
            set_weight_attrs(self.bias, {"output_dim": 0, "weight_loader": self.weight_loader})
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: Parameter, loaded_weight: torch.Tensor):
        input_dim = getattr(param, "input_dim", None)
        param_data = param.data
        if input_dim is not None:
            shard_size = param_data.shape[input_dim]
            loaded_weight = loaded_weight.narrow(input_dim, self.tp_rank * shard_size, shard_size)
        if len(loaded_weight.shape) == 0:
            loaded_weight = loaded_weight.reshape(1)
        assert param_data.shape == loaded_weight.shape
        param_data.copy_(loaded_weight)
