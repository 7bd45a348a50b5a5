"""deltacast as a vLLM weight-transfer backend: rollout workers take each version from a deltacast
fleet and apply exactly the version the trainer asked for, in place where the model's own loader
says each value lands.

Written against vLLM's weight-transfer API as of vLLM commit 02f250b03f38822ccdb63f27a3005d10ca81f385
(vllm/distributed/weight_transfer/base.py: ``WeightTransferEngine``, ``TrainerWeightTransferEngine``)
and 047c993cc49c32e9b94f5bf826a9214e163eb982 (vllm/distributed/weight_transfer/factory.py:
``WeightTransferEngineFactory``, ``WeightTransferTrainerFactory``), and against the newer
trainer API in which ``TrainerInitInfo`` carries a ``backend`` ClassVar and the trainer factory
dispatches on it (base.py as the search index stores it, id 58770368394; the index gives no
commit for it). The package registers both from the ``vllm.general_plugins`` entry point
(``deltacast = deltacast.vllm:register``), which vLLM runs in every process, so
``--weight-transfer-config '{"backend": "deltacast"}'`` selects it.

Per inference worker (each rank):

- ``init_transfer_engine({"parents": [...], ...})`` starts a ``deltacast.Worker``
  (``DeltacastInitInfo``); called again, it closes the first one.
- ``update_weights({"version": N, "run": R})`` (vLLM: parse_update_info -> receive_weights ->
  synchronize) brings the model to exactly version N of run R together with every other rank
  (``deltacast.engine.ModelUpdater``), or raises ``UpdateError`` on every rank, each keeping the
  version it had. The request is what ``trainer_send_weights`` (or the trainer engine) returns.
- ``start_weight_update`` and ``finish_weight_update`` do nothing: the whole transaction runs in
  ``update_weights``, with vLLM's layerwise reload inside it when the model's loader post-processes
  (``reload_mode`` "layerwise"; "direct" loads changed tensors with the loader alone).
- Draft models are not updated (``supports_draft_weight_update`` is False).
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator, Optional

from vllm.config.weight_transfer import WeightTransferConfig
from vllm.distributed.weight_transfer import base as _base
from vllm.distributed.weight_transfer.base import WeightTransferEngine, WeightTransferInitInfo, WeightTransferUpdateInfo

from . import DEFAULT_CHANGE_HISTORY, Error, Publisher, Request, Worker, attach
from .engine import ModelUpdater, UpdateError, default_group, default_worker_id

__all__ = ["DeltacastInitInfo", "DeltacastTrainerInitInfo", "DeltacastTrainerWeightTransferEngine", "DeltacastUpdateInfo",
           "DeltacastWeightTransferEngine", "UpdateError", "register"]

BACKEND = "deltacast"


@dataclass
class DeltacastInitInfo(WeightTransferInitInfo):
    """How each rank's worker joins the fleet (the arguments of ``deltacast.Worker``)."""

    parents: list[str] = field(default_factory=list)
    # Default: <host>-vllm-gpu<physical GPU> (stable across restarts, different for every engine
    # instance on the host). Given, each rank adds -dp<data-parallel rank>-r<rank>.
    worker_id: str = ""
    trust_keys: list[str] = field(default_factory=list)
    keys: Optional[tuple[str, str]] = None
    parent_keys: list[str] = field(default_factory=list)
    state_dir: str = ""  # each rank uses <state_dir>/<its worker id>
    change_history: int = DEFAULT_CHANGE_HISTORY
    change_history_bytes: int = 0
    placement: bool = True  # in-place writes where the loader's own map says (False: changed tensors through load_weights)
    # The socket of a worker this host runs with --share: each rank reads its versions
    # (deltacast.attach) instead of running a worker of its own; parents are then not needed.
    attach: str = ""

    def __post_init__(self):
        if isinstance(self.parents, str):
            self.parents = [self.parents]
        if not self.parents and not self.attach:
            raise ValueError("deltacast needs at least one parent endpoint, or a host's worker to attach to")


@dataclass
class DeltacastUpdateInfo(WeightTransferUpdateInfo):
    """The version to apply (``run`` empty: of the run the worker follows now), and how long to
    wait for it to verify."""

    version: int
    run: str = ""
    timeout_s: float = 600.0

    def __post_init__(self):
        Request(self.version, self.run)  # raises ValueError for a bad version or run
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}")


def engine_group():
    """The group of the engine's ranks that apply versions together: vLLM's world group (its gloo
    side), else torch.distributed's default group (deltacast.engine.default_group)."""
    try:
        from vllm.distributed.parallel_state import get_world_group

        world = get_world_group()
        return world.cpu_group if world.world_size > 1 else None
    except (ImportError, AssertionError, AttributeError):
        return default_group()


class _LayerwiseReload:
    """vLLM's layerwise reload around a whole load: each layer is loaded into a temporary copy,
    post-processed (quantization, repacking) and copied back into the live tensors."""

    def __init__(self, model, model_config):
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

        self._begin, self._end = initialize_layerwise_reload, finalize_layerwise_reload
        self.model, self.model_config = model, model_config

    def begin(self) -> None:
        self._begin(self.model)

    def end(self) -> None:
        self._end(self.model, self.model_config)


class DeltacastWeightTransferEngine(WeightTransferEngine[DeltacastInitInfo, DeltacastUpdateInfo]):
    init_info_cls = DeltacastInitInfo
    update_info_cls = DeltacastUpdateInfo
    # A draft update would load the target's checkpoint into the draft model: not offered.
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.worker: Optional[Worker] = None
        self.updater: Optional[ModelUpdater] = None
        self._placement = True

    def worker_id(self, given: str = "") -> str:
        rank = getattr(self.parallel_config, "rank", 0)
        dp_rank = getattr(self.parallel_config, "data_parallel_rank", 0)
        if given:
            return f"{given}-dp{dp_rank}-r{rank}"
        return default_worker_id("vllm", self.device, dp_rank, rank)

    def init_transfer_engine(self, init_info: DeltacastInitInfo) -> None:
        self.shutdown()  # a second init replaces the first worker
        if getattr(self.config, "reload_mode", "layerwise") == "layerwise":
            try:
                _LayerwiseReload(self.model, self.model_config)
            except ImportError as e:  # a model that post-processes would be loaded without it: refuse now
                raise Error(f"reload_mode 'layerwise', but this vLLM has no layerwise reload ({e}); 'direct' only suits models "
                            "whose post-load step leaves the parameters as loaded") from e
        worker_id = self.worker_id(init_info.worker_id)
        state_dir = os.path.join(init_info.state_dir, worker_id) if init_info.state_dir else None
        self.worker = attach(init_info.attach) if init_info.attach else Worker(worker_id, init_info.parents, keys=init_info.keys, parent_keys=init_info.parent_keys,
                             trust_keys=init_info.trust_keys, state_dir=state_dir, change_history=init_info.change_history,
                             change_history_bytes=init_info.change_history_bytes)
        self._placement = init_info.placement
        self.updater = None

    def start_weight_update(self) -> None:
        pass  # the transaction, layerwise reload included, runs in update_weights

    def finish_weight_update(self) -> None:
        pass

    def _updater(self) -> ModelUpdater:
        # vLLM may retarget updates (set_weight_update_target); each model keeps its own state.
        if self.updater is None or self.updater.model is not self.model:
            mode = getattr(self.config, "reload_mode", "layerwise")
            reload = _LayerwiseReload(self.model, self.model_config) if mode == "layerwise" else None
            self.updater = ModelUpdater(self.model, group=engine_group(), reload=reload, placement=self._placement)
        return self.updater

    def receive_weights(self, update_info: DeltacastUpdateInfo) -> None:
        if self.worker is None:
            raise Error("init_transfer_engine was not called")
        try:
            self._updater().update(self.worker, Request(update_info.version, update_info.run), timeout=update_info.timeout_s)
        except UpdateError as e:
            self.worker.report_model(e.model_run, e.model_version, error=str(e), failed=Request(update_info.version, update_info.run))
            raise
        updater = self.updater
        self.worker.report_model(updater.run, updater.version)

    def shutdown(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None

    @staticmethod
    def trainer_send_weights(iterator: Iterator[Any], trainer_args: dict[str, Any] | Any) -> dict:
        """Publishes the (name, tensor) pairs as the next version; returns the update info that
        asks for exactly it: {"version": N, "run": R}."""
        publisher = trainer_args["publisher"] if isinstance(trainer_args, dict) else trainer_args
        return publisher.request(publisher.publish(list(iterator))).as_dict()


# ---- the trainer side ----------------------------------------------------------------------------

# The newer API: TrainerInitInfo names its backend (a ClassVar) and the engine takes no config.
_NEWER_TRAINER_API = "backend" in getattr(getattr(_base, "TrainerInitInfo", None), "__annotations__", {})
_TrainerInitInfo = getattr(_base, "TrainerInitInfo", WeightTransferInitInfo)


@dataclass
class DeltacastTrainerInitInfo(_TrainerInitInfo):
    """The trainer's side (rank 0 publishes): where its publisher listens (or an existing
    ``deltacast.Publisher``), and what each inference rank's ``DeltacastInitInfo`` says (its
    parents: default, the publisher's endpoint)."""

    if _NEWER_TRAINER_API:
        backend: ClassVar[str] = BACKEND
    listen: str = "tcp://127.0.0.1:0"
    sign_key: str = ""
    publisher: Any = None
    worker_init: dict = field(default_factory=dict)
    timeout_s: float = 600.0


class DeltacastTrainerWeightTransferEngine(getattr(_base, "TrainerWeightTransferEngine", object)):
    """Trainer-side engine (``WeightTransferTrainerFactory.trainer_init``): every rank iterates the
    source in lockstep (it may gather shards); rank 0 publishes each round as a version and asks
    the inference side for exactly that version through the client."""

    init_info_cls = DeltacastTrainerInitInfo
    config_cls = WeightTransferConfig  # the API of 02f250b asks for one; the newer takes none

    def __init__(self, config=None, *, client, source=None, is_sender: bool = True, init_info=None):
        if "config" in inspect.signature(super().__init__).parameters:
            super().__init__(config, client=client, source=source, is_sender=is_sender)
        else:
            super().__init__(client=client, source=source, is_sender=is_sender)
        self.init_info = init_info
        self.publisher: Optional[Publisher] = None
        self._owns_publisher = False
        self.last_request: Optional[Request] = None

    @classmethod
    def trainer_init(cls, config=None, init_info=None, *, client, source=None):
        if init_info is None:  # the newer API: trainer_init(init_info, *, client, source)
            config, init_info = None, config
        engine = cls(config, client=client, source=source, is_sender=init_info.is_sender, init_info=init_info)
        if engine.is_sender:
            engine.publisher = init_info.publisher
            if engine.publisher is None:
                engine.publisher = Publisher(init_info.listen, sign_key=init_info.sign_key or None)
                engine._owns_publisher = True
            worker_init = {"parents": [engine.publisher.listening], **init_info.worker_init}
            client.init_weight_transfer_engine(worker_init)
        return engine

    def send_weights(self) -> None:
        named = list(self.source)  # every rank: the source's gathers are collectives
        if not self.is_sender:
            return
        request = self.publisher.request(self.publisher.publish(named))
        self.last_request = request
        self.client.start_weight_update()
        self.client.update_weights({**request.as_dict(), "timeout_s": self.init_info.timeout_s})
        if "weight_version" in inspect.signature(self.client.finish_weight_update).parameters:
            self.client.finish_weight_update(weight_version=f"{request.run}:{request.version}")
        else:
            self.client.finish_weight_update()

    def shutdown(self) -> None:
        if self._owns_publisher and self.publisher is not None:
            self.publisher.close()
        self.publisher = None


def register() -> None:
    """The ``vllm.general_plugins`` entry point: makes ``backend="deltacast"`` available, on the
    inference side and, where vLLM has it, the trainer side."""
    from vllm.distributed.weight_transfer import factory

    for registry, class_name in ((getattr(factory, "WeightTransferEngineFactory", None), "DeltacastWeightTransferEngine"),
                                 (getattr(factory, "WeightTransferTrainerFactory", None), "DeltacastTrainerWeightTransferEngine")):
        if registry is None:
            continue
        try:
            registry.register_engine(BACKEND, "deltacast.vllm", class_name)
        except ValueError:
            pass  # registered already in this process
