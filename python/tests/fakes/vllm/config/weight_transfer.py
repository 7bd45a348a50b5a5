"""Stand-in for vllm/config/weight_transfer.py as the search index stores it with ``reload_mode``
(index id 68884425237; the index exposes no commit): the backend name, validated against the
factory's registry when the engine is made, and how checkpoint-format engines write what they
receive ("layerwise": each layer loaded into a temporary copy, post-processed, copied back;
"direct": weight loaders write into the live parameters with no post-processing)."""
from dataclasses import dataclass
from typing import Literal


@dataclass
class WeightTransferConfig:
    backend: str = "nccl"
    reload_mode: Literal["layerwise", "direct"] = "layerwise"
