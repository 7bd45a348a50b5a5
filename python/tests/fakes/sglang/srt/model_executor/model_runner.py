"""Stand-in for python/sglang/srt/model_executor/model_runner.py at SGLang commit 01cc04e.

`ModelRunner.update_weights_from_tensor(named_tensors, load_format)` runs in every tensor-parallel
worker: it moves each tensor to the worker's device, then calls the function named by
`load_format` when it is listed in `--custom-weight-loader` (`fn(model, named_tensors)`), else
the model's `load_weights`.
"""
from dataclasses import dataclass, field

import torch

from sglang.srt.utils import dynamic_import


@dataclass
class ServerArgs:
    tp_size: int = 1
    custom_weight_loader: list = field(default_factory=list)


class ModelRunner:
    def __init__(self, model: torch.nn.Module, server_args: ServerArgs, tp_rank: int = 0, device: str = "cpu"):
        self.model = model
        self.server_args = server_args
        self.tp_rank = tp_rank
        self.device = device

    def update_weights_from_tensor(self, named_tensors, load_format=None):
        named_tensors = [(name, tensor.to(self.device)) for name, tensor in named_tensors]
        if load_format in self.server_args.custom_weight_loader:
            dynamic_import(load_format)(self.model, named_tensors)
        elif load_format is None:
            self.model.load_weights(named_tensors)
        else:
            raise NotImplementedError(f"Unknown load_format={load_format}")
        return True, "Success"
