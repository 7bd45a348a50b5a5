"""Stand-in for vllm/config/parallel.py: the fields a weight-transfer engine and the fake engine
read (``rank``: this worker's rank in its data-parallel replica; ``world_size``: TP x PP)."""
from dataclasses import dataclass


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    data_parallel_rank: int = 0
    rank: int = 0

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def world_size_across_dp(self) -> int:
        return self.world_size * self.data_parallel_size
