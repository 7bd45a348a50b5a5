"""Stand-in for vllm/distributed/weight_transfer/base.py at vLLM commit 02f250b.

The engine contract as upstream defines it: constructed with (config, vllm_config, device,
model); typed init and update info parsed from dicts by `init_info_cls` / `update_info_cls`;
`update_weights(dict)` runs parse_update_info -> receive_weights -> accelerator synchronize.
`CALLS` records the order in which the engine's methods ran, for the tests.
"""
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch

TInitInfo = TypeVar("TInitInfo", bound="WeightTransferInitInfo")
TUpdateInfo = TypeVar("TUpdateInfo", bound="WeightTransferUpdateInfo")

CALLS: list[str] = []


@dataclass
class WeightTransferInitInfo(ABC):  # noqa: B024
    pass


@dataclass
class WeightTransferUpdateInfo(ABC):  # noqa: B024
    pass


class WeightTransferEngine(ABC, Generic[TInitInfo, TUpdateInfo]):
    init_info_cls: type
    update_info_cls: type
    supports_draft_weight_update: bool = True

    def __init__(self, config, vllm_config, device: torch.device, model: torch.nn.Module) -> None:
        self.config = config
        self.vllm_config = vllm_config
        self.parallel_config = vllm_config.parallel_config
        self.model_config = vllm_config.model_config
        self.device = device
        self.model = model

    def parse_init_info(self, init_dict: dict[str, Any]):
        try:
            return self.init_info_cls(**init_dict)
        except TypeError as e:
            raise ValueError(f"Invalid init_info for {self.__class__.__name__}: {e}") from e

    def parse_update_info(self, update_dict: dict[str, Any]):
        try:
            return self.update_info_cls(**update_dict)
        except TypeError as e:
            raise ValueError(f"Invalid update_info for {self.__class__.__name__}: {e}") from e

    @abstractmethod
    def init_transfer_engine(self, init_info) -> None: ...

    @abstractmethod
    def start_weight_update(self) -> None: ...

    @abstractmethod
    def finish_weight_update(self) -> None: ...

    def update_weights(self, update_info: dict[str, Any]) -> None:
        CALLS.append("update_weights")
        typed = self.parse_update_info(update_info)
        self.receive_weights(typed)
        # Upstream: torch.accelerator.synchronize() (torch >= 2.6); nothing to wait for on CPU.
        CALLS.append("synchronize")

    @abstractmethod
    def receive_weights(self, update_info) -> None: ...

    @abstractmethod
    def shutdown(self) -> None: ...

    @staticmethod
    @abstractmethod
    def trainer_send_weights(iterator, trainer_args) -> None: ...
