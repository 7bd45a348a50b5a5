"""Stand-in for vllm.config: the VllmConfig fields the weight-transfer engine and the GPU worker read.

vllm/distributed/weight_transfer/base.py at 02f250b03f38822ccdb63f27a3005d10ca81f385 reads
``vllm_config.parallel_config`` and ``vllm_config.model_config``; vllm/v1/worker/gpu_worker.py (the
search index's id 54489122067, no commit exposed) reads ``vllm_config.weight_transfer_config``; the
layerwise reload (model_loader/reload/layerwise.py at 01424e4b5c6768cacbb637fa08e7064a4301ec68)
reads ``model_config.dtype``.
"""
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from vllm.config.parallel import ParallelConfig
from vllm.config.weight_transfer import WeightTransferConfig


@dataclass
class ModelConfig:
    model: str = "fake"
    dtype: torch.dtype = torch.bfloat16
    hf_config: Any = None


@dataclass
class SpeculativeConfig:
    draft_model_config: Optional[ModelConfig] = None


@dataclass
class VllmConfig:
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    model_config: ModelConfig = field(default_factory=ModelConfig)
    weight_transfer_config: Optional[WeightTransferConfig] = None
    speculative_config: Optional[SpeculativeConfig] = None
