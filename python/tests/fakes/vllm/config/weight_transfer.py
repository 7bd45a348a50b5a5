"""Stand-in for vllm/config/weight_transfer.py (upstream: a config dataclass with `backend`)."""
from dataclasses import dataclass


@dataclass
class WeightTransferConfig:
    backend: str = "nccl"
