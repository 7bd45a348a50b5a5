"""Stand-in for vllm/distributed/weight_transfer/base.py at vLLM commit
02f250b03f38822ccdb63f27a3005d10ca81f385, written from that file.

The worker side: an engine is constructed with (config, vllm_config, device, model); typed init
and update info are parsed from dicts by ``init_info_cls`` / ``update_info_cls`` (a TypeError
becomes ValueError "Invalid init_info/update_info for <Class>: ..."); ``update_weights(dict)`` runs
parse_update_info -> receive_weights -> accelerator synchronize; ``set_weight_update_target`` /
``reset_weight_update_target`` swap the model (draft updates); ``supports_draft_weight_update``
defaults to True.

The trainer side (PR "Stateful Trainer Send [1/N]"): ``WeightSource`` / ``ModuleSource``,
``TrainerInitInfo`` (keyword-only ``rank``, ``is_sender`` for rank 0), the structural
``VLLMWeightSyncClient`` (four methods) and ``TrainerWeightTransferEngine(config, *, client,
source, is_sender)`` with the classmethod ``trainer_init(config, init_info, *, client, source)``
and ``send_weights()``. ``CALLS`` records the order in which engine methods ran, for the tests.
"""
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import torch

from vllm.config.parallel import ParallelConfig
from vllm.config.weight_transfer import WeightTransferConfig

TInitInfo = TypeVar("TInitInfo", bound="WeightTransferInitInfo")
TUpdateInfo = TypeVar("TUpdateInfo", bound="WeightTransferUpdateInfo")
TConfig = TypeVar("TConfig", bound="WeightTransferConfig")

CALLS: list[str] = []


def materialize_full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    full_tensor = getattr(tensor, "full_tensor", None)
    return full_tensor() if callable(full_tensor) else tensor


@dataclass(frozen=True)
class ParamMeta:
    name: str
    dtype: torch.dtype
    shape: tuple


class WeightSource(ABC):
    @abstractmethod
    def metadata(self) -> list: ...

    @abstractmethod
    def __iter__(self) -> Iterator: ...


class ModuleSource(WeightSource):
    def __init__(self, module: torch.nn.Module) -> None:
        self._module = module

    def metadata(self) -> list:
        return [ParamMeta(name, p.dtype, tuple(p.shape)) for name, p in self._module.named_parameters()]

    def __iter__(self):
        for name, param in self._module.named_parameters():
            yield name, materialize_full_tensor(param)


@dataclass
class WeightTransferInitInfo(ABC):  # noqa: B024
    pass


@dataclass
class TrainerInitInfo(WeightTransferInitInfo):
    rank: int = field(kw_only=True)

    @property
    def is_sender(self) -> bool:
        return self.rank == 0


@dataclass
class WeightTransferUpdateInfo(ABC):  # noqa: B024
    pass


@dataclass
class WeightTransferInitRequest:
    init_info: dict = field(default_factory=dict)


@dataclass
class WeightTransferUpdateRequest:
    update_info: dict = field(default_factory=dict)


class WeightTransferEngine(ABC, Generic[TInitInfo, TUpdateInfo]):
    init_info_cls: type
    update_info_cls: type
    supports_draft_weight_update: bool = True

    def __init__(self, config: WeightTransferConfig, vllm_config, device: torch.device, model: torch.nn.Module) -> None:
        self.config = config
        self.vllm_config = vllm_config
        self.parallel_config: ParallelConfig = vllm_config.parallel_config
        self.model_config = vllm_config.model_config
        self.device = device
        self.model = model
        self._default_model_config = self.model_config
        self._default_model = model

    def set_weight_update_target(self, model: torch.nn.Module, model_config: Any) -> None:
        self.model = model
        self.model_config = model_config

    def reset_weight_update_target(self) -> None:
        self.model = self._default_model
        self.model_config = self._default_model_config

    def parse_init_info(self, init_dict: dict):
        try:
            return self.init_info_cls(**init_dict)
        except TypeError as e:
            raise ValueError(f"Invalid init_info for {self.__class__.__name__}: {e}") from e

    def parse_update_info(self, update_dict: dict):
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

    def update_weights(self, update_info: dict) -> None:
        CALLS.append("update_weights")
        typed_update_info = self.parse_update_info(update_info)
        self.receive_weights(typed_update_info)
        # Upstream: torch.accelerator.synchronize() (torch >= 2.6); nothing to wait for on CPU.
        CALLS.append("synchronize")

    @abstractmethod
    def receive_weights(self, update_info) -> None: ...

    @abstractmethod
    def shutdown(self) -> None: ...

    @staticmethod
    @abstractmethod
    def trainer_send_weights(iterator, trainer_args) -> None: ...


@runtime_checkable
class VLLMWeightSyncClient(Protocol):
    def init_weight_transfer_engine(self, init_info: dict) -> None: ...

    def start_weight_update(self) -> None: ...

    def update_weights(self, update_info: dict) -> None: ...

    def finish_weight_update(self) -> None: ...


class TrainerWeightTransferEngine(ABC, Generic[TConfig, TInitInfo]):
    init_info_cls: type
    config_cls: type

    def __init__(self, config, *, client: VLLMWeightSyncClient, source: WeightSource, is_sender: bool = True) -> None:
        self.config = config
        self.is_sender = is_sender
        self.client = client
        self.source = source

    @classmethod
    @abstractmethod
    def trainer_init(cls, config, init_info, *, client, source): ...

    @abstractmethod
    def send_weights(self) -> None: ...

    def shutdown(self) -> None:
        pass
