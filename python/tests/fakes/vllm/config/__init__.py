"""Stand-in for vllm.config: the VllmConfig fields a weight-transfer engine reads."""
from dataclasses import dataclass, field

from vllm.config.parallel import ParallelConfig


@dataclass
class ModelConfig:
    model: str = "fake-llama"


@dataclass
class VllmConfig:
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    model_config: ModelConfig = field(default_factory=ModelConfig)
