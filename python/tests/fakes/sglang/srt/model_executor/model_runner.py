"""Stand-in for python/sglang/srt/model_executor/model_runner.py at SGLang commit
0005834cdb2a5b7472789ccbf0d3361b5cf853b8, written from ``ModelRunner.update_weights_from_tensor``
and the helpers beside it: the named tensors are unwrapped (a ``LocalSerializedTensor`` holds one
serialized tensor per tensor-parallel rank) and moved to the device; then ``load_format``
"direct" loads them with ``default_weight_loader``, one listed in ``--custom-weight-loader`` calls
that function as ``fn(model, named_tensors)``, None calls the model's ``load_weights``, anything
else raises NotImplementedError. Nothing is caught: an exception propagates (to the scheduler,
which then takes the server down). It returns (True, "Success").

Differences from upstream: the "flattened_bucket" format is left out; the device is the
runner's (CPU here).
"""
from dataclasses import dataclass
from typing import List, Optional

import torch

from sglang.srt.utils import MultiprocessingSerializer, dynamic_import
from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions


def default_weight_loader(param, loaded_weight):
    assert param.size() == loaded_weight.size()
    param.data.copy_(loaded_weight)


class ModelRunner:
    def __init__(self, model: torch.nn.Module, server_args, tp_rank: int = 0, device: str = "cpu"):
        self.model = model
        self.server_args = server_args
        self.tp_rank = tp_rank
        self.device = device

    def update_weights_from_tensor(self, named_tensors, load_format: Optional[str] = None):
        monkey_patch_torch_reductions()
        named_tensors = [(name, _unwrap_tensor(tensor, tp_rank=self.tp_rank, device=self.device)) for name, tensor in named_tensors]
        if load_format == "direct":
            _model_load_weights_direct(self.model, named_tensors)
        elif load_format in self.server_args.custom_weight_loader:
            custom_loader = dynamic_import(load_format)
            custom_loader(self.model, named_tensors)
        elif load_format is None:
            self.model.load_weights(named_tensors)
        else:
            raise NotImplementedError(f"Unknown load_format={load_format}")
        return True, "Success"


def _model_load_weights_direct(model, named_tensors):
    params_dict = dict(model.named_parameters())
    for name, tensor in named_tensors:
        default_weight_loader(params_dict[name], tensor)


def _unwrap_tensor(tensor, tp_rank, device):
    if isinstance(tensor, LocalSerializedTensor):
        tensor = tensor.get(tp_rank)
    return tensor.to(device)


@dataclass
class LocalSerializedTensor:
    values: List[bytes]

    def get(self, rank: int):
        return MultiprocessingSerializer.deserialize(self.values[rank])
