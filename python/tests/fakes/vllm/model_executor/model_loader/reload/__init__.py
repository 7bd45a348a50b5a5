"""Stand-in for vllm/model_executor/model_loader/reload/__init__.py at vLLM commit
030ea52effcb05071543c8c42b8f0145e94cee43: the layerwise reload's public functions."""
from .layerwise import (
    finalize_layerwise_processing,
    finalize_layerwise_reload,
    initialize_layerwise_reload,
    record_metadata_for_reloading,
)

__all__ = ["record_metadata_for_reloading", "initialize_layerwise_reload", "finalize_layerwise_processing", "finalize_layerwise_reload"]
