"""Stand-in for vllm/model_executor/model_loader/reload/layerwise.py at vLLM commit
01424e4b5c6768cacbb637fa08e7064a4301ec68, written from that file.

``record_metadata_for_reloading(model)`` (vLLM runs it when it builds the model) records each
layer's parameters. ``initialize_layerwise_reload(model)`` keeps each layer's live ("kernel")
tensors aside, puts empty stand-ins on the meta device in their place, and wraps every
parameter's ``weight_loader`` so that what is loaded is buffered and counted. Once a layer has
loaded as many elements as it holds, it is processed: fresh tensors are made, the buffered loads
replayed with the original loaders, the layer's ``quant_method.process_weights_after_loading``
run, and the result copied into the kernel tensors, which go back in place (their storage, and
so CUDA graphs, unchanged). ``finalize_layerwise_reload(model, model_config)`` puts back the
kernel tensors of layers that loaded nothing (warning "Failed to load weights") and processes
those that loaded only part (their unloaded elements are whatever the fresh tensors held).

Differences from upstream: layers are modules with parameters of their own; no attention
deferral, runtime-bound mappings, buffers or torchao; the elements a load writes are counted by
running the original loader into a scratch copy.
"""
import logging

import torch

logger = logging.getLogger("vllm.model_executor.model_loader.reload")

_RECORDED: dict = {}  # id(layer) -> {param name: (shape, dtype, attributes)}
_INFO: dict = {}  # id(layer) -> LayerReloadingInfo while a reload is open


class LayerReloadingInfo:
    def __init__(self, layer):
        self.layer = layer
        self.kernel_tensors = {}
        self.loaded_weights = []  # (param name, args, kwargs)
        self.load_numel = 0
        self.load_numel_total = 0
        self.processed = False


def _layers(model):
    return [m for m in model.modules() if any(True for _ in m.parameters(recurse=False))]


def record_metadata_for_reloading(model: torch.nn.Module):
    for layer in _layers(model):
        _RECORDED[id(layer)] = {name: (tuple(p.shape), p.dtype, {k: v for k, v in vars(p).items() if not k.startswith("_")})
                                for name, p in layer.named_parameters(recurse=False)}


def _original_loader(param):
    loader = getattr(param, "weight_loader", None)
    while loader is not None and getattr(loader, "__name__", "") == "online_process_loader":
        loader = loader.__wrapped__
    return loader


def _make_online_process_loader(info: LayerReloadingInfo, name: str, original):
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    loader = original or default_weight_loader

    def online_process_loader(param, *args, **kwargs):
        if info.processed:
            logger.debug("%s: Excessive loading", info.layer.__class__.__name__)
            return
        info.loaded_weights.append((name, args, kwargs))
        # Elements this load writes: run it into a scratch copy of the parameter.
        scratch = torch.nn.Parameter(torch.full(param.shape, float("nan"), dtype=torch.float64), requires_grad=False)
        vars(scratch).update({k: v for k, v in vars(param).items() if not k.startswith("_") and k != "weight_loader"})
        loader(scratch, *args, **kwargs)
        info.load_numel += int((~torch.isnan(scratch.data)).sum())
        if info.load_numel >= info.load_numel_total:
            _layerwise_process(info)

    online_process_loader.__wrapped__ = loader
    return online_process_loader


@torch.no_grad()
def initialize_layerwise_reload(model: torch.nn.Module):
    for layer in _layers(model):
        recorded = _RECORDED.get(id(layer))
        if recorded is None or id(layer) in _INFO:
            continue
        info = _INFO[id(layer)] = LayerReloadingInfo(layer)
        info.kernel_tensors = dict(layer.named_parameters(recurse=False))
        info.load_numel_total = sum(p.numel() for p in info.kernel_tensors.values())
        for name, (shape, dtype, attrs) in recorded.items():
            kernel = info.kernel_tensors[name]
            stand_in = torch.nn.Parameter(torch.empty(shape, dtype=dtype, device="meta"), requires_grad=False)
            vars(stand_in).update({k: v for k, v in attrs.items() if k != "weight_loader"})
            stand_in.weight_loader = _make_online_process_loader(info, name, _original_loader(kernel))
            setattr(layer, name, stand_in)


def _layerwise_process(info: LayerReloadingInfo):
    layer = info.layer
    recorded = _RECORDED[id(layer)]
    for name, (shape, dtype, attrs) in recorded.items():  # materialize
        kernel = info.kernel_tensors[name]
        fresh = torch.nn.Parameter(torch.empty(shape, dtype=dtype, device=kernel.device), requires_grad=False)
        vars(fresh).update({k: v for k, v in attrs.items() if k != "weight_loader"})
        fresh.weight_loader = _original_loader(kernel)
        setattr(layer, name, fresh)
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    for name, args, kwargs in info.loaded_weights:
        param = getattr(layer, name)
        (param.weight_loader or default_weight_loader)(param, *args, **kwargs)
    quant_method = getattr(layer, "quant_method", None)
    if quant_method is not None:
        quant_method.process_weights_after_loading(layer)
    for name, kernel in info.kernel_tensors.items():  # copy into the live storage, put it back
        kernel.data.copy_(getattr(layer, name).data)
        setattr(layer, name, kernel)
    info.processed = True
    logger.debug("%s: Processed", layer.__class__.__name__)


@torch.no_grad()
def finalize_layerwise_processing(model: torch.nn.Module, model_config):
    for layer in _layers(model):
        info = _INFO.pop(id(layer), None)
        if info is None or info.processed:
            continue
        if info.load_numel <= 0:
            if info.load_numel_total > 0:
                logger.warning("%s: Failed to load weights", layer.__class__.__name__)
            for name, kernel in info.kernel_tensors.items():
                setattr(layer, name, kernel)
        else:
            logger.debug("%s: Delayed processing", layer.__class__.__name__)
            _layerwise_process(info)


def finalize_layerwise_reload(*args, **kwargs):
    finalize_layerwise_processing(*args, **kwargs)
