"""Stand-in for vllm/config/parallel.py: the tensor-parallel size and this worker's rank."""
from dataclasses import dataclass


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    rank: int = 0
