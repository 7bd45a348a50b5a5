"""Stand-in for vllm/distributed/weight_transfer/base.py as the search index stores it with the
trainer's ``backend`` ClassVar (index id 58770368394; the index exposes no commit), written from
that file. What changed since 02f250b03f38822ccdb63f27a3005d10ca81f385 and matters here:
``TrainerInitInfo`` is a plain dataclass whose concrete subclasses must set a class-level
``backend`` (``__init_subclass__`` raises TypeError otherwise), which the trainer factory
dispatches on; ``TrainerWeightTransferEngine(*, client, source=None, is_sender=True)`` takes no
config; ``trainer_init(init_info, *, client, source=None)``; the worker engine has no
``trainer_send_weights`` and gains ``abort_weight_update``; the sync client's
``finish_weight_update(weight_version=None)`` takes the version's name.
"""
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Protocol, TypeVar, runtime_checkable

import torch

from vllm.config.parallel import ParallelConfig
from vllm.config.weight_transfer import WeightTransferConfig

TInitInfo = TypeVar("TInitInfo")
TUpdateInfo = TypeVar("TUpdateInfo")
TTrainerInitInfo = TypeVar("TTrainerInitInfo")
CALLS: list = []


def materialize_full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    full_tensor = getattr(tensor, "full_tensor", None)
    return full_tensor() if callable(full_tensor) else tensor


class WeightSource(ABC):
    @abstractmethod
    def metadata(self) -> list: ...

    @abstractmethod
    def __iter__(self): ...


class ModuleSource(WeightSource):
    def __init__(self, module: torch.nn.Module) -> None:
        self._module = module

    def metadata(self) -> list:
        return [(name, p.dtype, tuple(p.shape)) for name, p in self._module.named_parameters()]

    def __iter__(self):
        for name, param in self._module.named_parameters():
            yield name, materialize_full_tensor(param)


@dataclass
class WeightTransferInitInfo(ABC):  # noqa: B024
    pass


@dataclass
class TrainerInitInfo:
    backend: ClassVar[str]
    rank: int = field(kw_only=True)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not getattr(cls, "backend", None):
            raise TypeError(f"{cls.__name__} must set a class-level `backend` string (the WeightTransferTrainerFactory registry key).")

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

    def set_weight_update_target(self, model, model_config) -> None:
        self.model, self.model_config = model, model_config

    def reset_weight_update_target(self) -> None:
        self.model, self.model_config = self._default_model, self._default_model_config

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

    def abort_weight_update(self) -> None:
        pass

    def update_weights(self, update_info: dict) -> None:
        CALLS.append("update_weights")
        self.receive_weights(self.parse_update_info(update_info))
        CALLS.append("synchronize")

    @abstractmethod
    def receive_weights(self, update_info) -> None: ...

    @abstractmethod
    def shutdown(self) -> None: ...


@runtime_checkable
class VLLMWeightSyncClient(Protocol):
    def init_weight_transfer_engine(self, init_info: dict) -> None: ...

    def start_weight_update(self) -> None: ...

    def update_weights(self, update_info: dict) -> None: ...

    def finish_weight_update(self, weight_version: str | None = None) -> None: ...


class TrainerWeightTransferEngine(ABC, Generic[TTrainerInitInfo]):
    init_info_cls: type

    def __init__(self, *, client, source=None, is_sender: bool = True) -> None:
        self.is_sender = is_sender
        self.client = client
        self.source = source

    @classmethod
    @abstractmethod
    def trainer_init(cls, init_info, *, client, source=None): ...

    @abstractmethod
    def send_weights(self) -> None: ...

    def shutdown(self) -> None:
        pass
