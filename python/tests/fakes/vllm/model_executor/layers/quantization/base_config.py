"""Stand-in for vllm/model_executor/layers/quantization/base_config.py: ``QuantizeMethodBase``,
whose ``process_weights_after_loading(layer)`` vLLM's loader runs once a layer's weights are in
(model_loader/reload/layerwise.py at 01424e4b5c6768cacbb637fa08e7064a4301ec68 runs it per layer on
a reload). ``RepackedLinearMethod`` is the tests' own: it repacks a weight into a kernel layout
(columns interleaved), as Marlin-style kernels do, so that the parameter no longer holds the
checkpoint's values where the loader put them."""
import torch


class QuantizeMethodBase:
    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        return


class RepackedLinearMethod(QuantizeMethodBase):
    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        w = layer.weight.data
        cols = w.shape[1]
        order = torch.cat([torch.arange(0, cols, 2), torch.arange(1, cols, 2)])
        w.copy_(w[:, order].clone())
