"""Stand-in for vllm/v1/worker/gpu_worker.py as the search index stores it (index id
54489122067; the index exposes no commit), written from its ``load_model`` and weight-transfer
methods: the engine is made by ``WeightTransferEngineFactory.create_engine(config, vllm_config,
device, model)`` when ``weight_transfer_config`` is set, and every call without one raises
RuntimeError("Weight transfer not configured. ..."); ``start_weight_update`` while a session is
open raises, ``update_weights`` outside one raises, and an engine exception in it closes the
session and propagates; ``finish_weight_update`` without a session raises.

That version has no draft path. The one here follows vllm/entrypoints/serve/dev/rlhf/api_router.py
at 6fbea1171830682c53ecb7d3ae67495fa799e62f (``start_weight_update(include_draft=...)``) and
base.py at 02f250b03f38822ccdb63f27a3005d10ca81f385 (``supports_draft_weight_update``,
``set_weight_update_target``, ``reset_weight_update_target``): a draft session on an engine that
does not support it raises RuntimeError before anything starts. The messages of a missing draft
model, and where exactly upstream resets the target, are this stand-in's own (upstream's
draft-aware worker was not available to read).

``load_model`` stands for the model runner's load: the model is built, its metadata recorded for
reloading (as vLLM's initialize_model does), the checkpoint loaded through ``load_weights`` and
each quantized layer post-processed.
"""
import torch

from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
from vllm.model_executor.model_loader.reload import record_metadata_for_reloading


def build_model(factory, checkpoint: dict):
    model = factory()
    record_metadata_for_reloading(model)
    with torch.no_grad():
        model.load_weights(checkpoint.items())
        for layer in model.modules():
            quant_method = getattr(layer, "quant_method", None)
            if quant_method is not None:
                quant_method.process_weights_after_loading(layer)
    return model


class Worker:
    def __init__(self, vllm_config, device: torch.device, model_factory, checkpoint: dict, draft_model_factory=None):
        self.vllm_config = vllm_config
        self.device = device
        self._factory, self._checkpoint, self._draft_factory = model_factory, checkpoint, draft_model_factory
        self.model = self.draft_model = None
        self.weight_transfer_engine = None
        self._weight_update_active = False
        self._weight_update_is_draft = False

    def load_model(self) -> None:
        self.model = build_model(self._factory, self._checkpoint)
        if self._draft_factory is not None:
            self.draft_model = self._draft_factory()
        if self.vllm_config.weight_transfer_config is not None:
            self.weight_transfer_engine = WeightTransferEngineFactory.create_engine(
                self.vllm_config.weight_transfer_config, self.vllm_config, self.device, self.model)

    def _check_weight_transfer_engine(self) -> None:
        if self.weight_transfer_engine is None:
            raise RuntimeError("Weight transfer not configured. Please set weight_transfer_config to enable weight transfer.")

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self._check_weight_transfer_engine()
        typed_init_info = self.weight_transfer_engine.parse_init_info(init_info)
        self.weight_transfer_engine.init_transfer_engine(typed_init_info)

    def start_weight_update(self, include_draft: bool = False) -> None:
        self._check_weight_transfer_engine()
        engine = self.weight_transfer_engine
        if include_draft and not engine.supports_draft_weight_update:
            raise RuntimeError(f"{type(engine).__name__} does not support draft model weight updates.")
        if self._weight_update_active:
            raise RuntimeError("start_weight_update called while a weight update is already active. Call finish_weight_update first.")
        if include_draft:
            if self.draft_model is None or self.vllm_config.speculative_config is None:
                raise RuntimeError("no draft model to update")
            engine.set_weight_update_target(self.draft_model, self.vllm_config.speculative_config.draft_model_config)
        try:
            engine.start_weight_update()
        except BaseException:
            engine.reset_weight_update_target()
            raise
        self._weight_update_active = True
        self._weight_update_is_draft = include_draft

    def update_weights(self, update_info: dict) -> None:
        self._check_weight_transfer_engine()
        if not self._weight_update_active:
            raise RuntimeError("start_weight_update must be called before update_weights.")
        try:
            self.weight_transfer_engine.update_weights(update_info)
        except BaseException:
            self._weight_update_active = False
            self.weight_transfer_engine.reset_weight_update_target()
            raise

    def finish_weight_update(self) -> None:
        self._check_weight_transfer_engine()
        if not self._weight_update_active:
            raise RuntimeError("finish_weight_update called without a matching start_weight_update.")
        self.weight_transfer_engine.finish_weight_update()
        self.weight_transfer_engine.reset_weight_update_target()
        self._weight_update_active = False

    def shutdown(self) -> None:
        if self.weight_transfer_engine is not None:
            self.weight_transfer_engine.shutdown()
