"""Stand-in for vllm/distributed/weight_transfer/factory.py at vLLM commit 047c993: a registry of
engines by backend name, lazily imported from (module path, class name)."""
import importlib


class WeightTransferEngineFactory:
    _registry: dict = {}

    @classmethod
    def register_engine(cls, name, module_path_or_cls, class_name=None) -> None:
        if name in cls._registry:
            raise ValueError(f"Weight transfer engine '{name}' is already registered.")
        if isinstance(module_path_or_cls, str):
            if class_name is None:
                raise ValueError("class_name is required when registering with module path")
            cls._registry[name] = lambda: getattr(importlib.import_module(module_path_or_cls), class_name)
        else:
            cls._registry[name] = lambda: module_path_or_cls

    @classmethod
    def create_engine(cls, config, vllm_config, device, model):
        if config.backend not in cls._registry:
            raise ValueError(f"Invalid weight transfer backend: {config.backend}. Available engines: {list(cls._registry)}")
        return cls._registry[config.backend]()(config, vllm_config, device, model)
