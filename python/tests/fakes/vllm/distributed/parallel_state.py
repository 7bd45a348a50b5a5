"""Stand-in for vllm/distributed/parallel_state.py as the search index stores it (index id
58075476633; the index exposes no commit), written from its ``GroupCoordinator`` and world group:
a coordinator over a list of ranks holds a device group and a gloo ``cpu_group`` for them, with
``world_size`` and ``rank_in_group``; ``get_world_group()`` asserts the world group was made
(``init_world_group``). Here the device group is the gloo group too (CPU only)."""
from typing import Optional

import torch
import torch.distributed


class GroupCoordinator:
    def __init__(self, group_ranks: list, local_rank: int, torch_distributed_backend: str, use_device_communicator: bool = False,
                 group_name: Optional[str] = None):
        self.rank = torch.distributed.get_rank()
        self.local_rank = local_rank
        self_cpu_group = None
        for ranks in group_ranks:
            cpu_group = torch.distributed.new_group(ranks, backend="gloo")
            if self.rank in ranks:
                self.ranks = ranks
                self.world_size = len(ranks)
                self.rank_in_group = ranks.index(self.rank)
                self_cpu_group = cpu_group
        assert self_cpu_group is not None
        self.cpu_group = self_cpu_group
        self.device_group = self_cpu_group


_WORLD: Optional[GroupCoordinator] = None


def get_world_group() -> GroupCoordinator:
    assert _WORLD is not None, "world group is not initialized"
    return _WORLD


def init_world_group(ranks: list, local_rank: int, backend: str) -> GroupCoordinator:
    return GroupCoordinator(group_ranks=[ranks], local_rank=local_rank, torch_distributed_backend=backend, group_name="world")


def init_distributed_environment(world_size: int, rank: int, distributed_init_method: str, local_rank: int = 0, backend: str = "gloo"):
    global _WORLD
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend=backend, init_method=distributed_init_method, world_size=world_size, rank=rank)
    _WORLD = init_world_group(list(range(torch.distributed.get_world_size())), local_rank, backend)
