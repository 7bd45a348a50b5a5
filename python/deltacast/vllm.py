"""deltacast as a vLLM weight-transfer backend: rollout workers take each version from a deltacast
fleet and apply it to the model, in place where they can.

Written against vLLM's weight-transfer engine API as of vLLM commit 02f250b
(vllm/distributed/weight_transfer/base.py: ``WeightTransferEngine``) and 047c993
(vllm/distributed/weight_transfer/factory.py: ``WeightTransferEngineFactory.register_engine``).
The package registers the backend from the ``vllm.general_plugins`` entry point
(``deltacast = deltacast.vllm:register``), which vLLM runs in every process, so
``--weight-transfer-config '{"backend": "deltacast"}'`` selects it.

Per inference worker (each tensor-parallel rank):

- ``init_transfer_engine({"parents": [...], ...})`` starts a ``deltacast.Worker`` (``DeltacastInitInfo``).
- ``update_weights({"version": N})`` (vLLM: parse_update_info -> receive_weights -> synchronize)
  waits until version N verified, then applies it through a ``deltacast.engine.ModelUpdater``:
  changed values in place on parameters that hold a checkpoint tensor whole, the model's
  ``load_weights`` (fusing q/k/v and gate/up, keeping this rank's slice) for the rest. Nothing
  touches the model before the whole version verified: a version that does not arrive intact
  raises ``UpdateError`` and leaves the model at its old version.
- ``start_weight_update`` and ``finish_weight_update`` do nothing (the engine applies in place).

Trainer side: ``DeltacastWeightTransferEngine.trainer_send_weights(named_parameters,
{"publisher": deltacast.Publisher(...)})`` publishes and returns the version number, which the
trainer then passes to the inference side's ``update_weights``.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

from vllm.distributed.weight_transfer.base import WeightTransferEngine, WeightTransferInitInfo, WeightTransferUpdateInfo

from . import Error, Worker
from .engine import ModelUpdater, UpdateError

__all__ = ["DeltacastInitInfo", "DeltacastUpdateInfo", "DeltacastWeightTransferEngine", "UpdateError", "register"]

BACKEND = "deltacast"


@dataclass
class DeltacastInitInfo(WeightTransferInitInfo):
    """How the worker joins the fleet (the arguments of ``deltacast.Worker``)."""

    parents: list[str]
    worker_id: str = ""  # default: host name, data-parallel and tensor-parallel rank
    trust_keys: list[str] = field(default_factory=list)
    keys: Optional[tuple[str, str]] = None
    parent_keys: list[str] = field(default_factory=list)
    state_dir: str = ""
    change_history: int = 4

    def __post_init__(self):
        if isinstance(self.parents, str):
            self.parents = [self.parents]
        if not self.parents:
            raise ValueError("deltacast needs at least one parent endpoint")


@dataclass
class DeltacastUpdateInfo(WeightTransferUpdateInfo):
    """The version to apply, and how long to wait for it to verify."""

    version: int
    timeout_s: float = 600.0

    def __post_init__(self):
        if int(self.version) < 1:
            raise ValueError(f"versions count from 1, got {self.version}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}")


class DeltacastWeightTransferEngine(WeightTransferEngine[DeltacastInitInfo, DeltacastUpdateInfo]):
    init_info_cls = DeltacastInitInfo
    update_info_cls = DeltacastUpdateInfo

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.worker: Optional[Worker] = None
        self.updater: Optional[ModelUpdater] = None

    def init_transfer_engine(self, init_info: DeltacastInitInfo) -> None:
        # Stable across restarts (a worker finds its saved versions by id), one per rank.
        rank = getattr(self.parallel_config, "rank", 0)
        dp_rank = getattr(self.parallel_config, "data_parallel_rank", 0)
        worker_id = init_info.worker_id or f"{socket.gethostname()}-vllm-dp{dp_rank}-tp{rank}"
        self.worker = Worker(worker_id, init_info.parents, keys=init_info.keys, parent_keys=init_info.parent_keys,
                             trust_keys=init_info.trust_keys, state_dir=init_info.state_dir or None,
                             change_history=init_info.change_history)
        self.updater = ModelUpdater(self.model, device=self.device)

    def start_weight_update(self) -> None:
        pass  # applied in place: no layerwise reload to set up

    def finish_weight_update(self) -> None:
        pass

    def receive_weights(self, update_info: DeltacastUpdateInfo) -> None:
        if self.worker is None or self.updater is None:
            raise Error("init_transfer_engine was not called")
        if self.updater.model is not self.model:  # vLLM may retarget updates (set_weight_update_target)
            self.updater = ModelUpdater(self.model, device=self.device)
        self.updater.update(self.worker, int(update_info.version), timeout=update_info.timeout_s)

    def shutdown(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None

    @staticmethod
    def trainer_send_weights(iterator: Iterator[Any], trainer_args: dict[str, Any] | Any) -> int:
        """Publishes the (name, tensor) pairs as the next version; returns its number."""
        publisher = trainer_args["publisher"] if isinstance(trainer_args, dict) else trainer_args
        return publisher.publish(list(iterator))


def register() -> None:
    """The ``vllm.general_plugins`` entry point: makes ``backend="deltacast"`` available."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    try:
        WeightTransferEngineFactory.register_engine(BACKEND, "deltacast.vllm", "DeltacastWeightTransferEngine")
    except ValueError:
        pass  # registered already in this process
