"""Stand-in for vllm/distributed/weight_transfer/factory.py of the newer trainer API. The search
index does not hold that version of the file; written from base.py (index id 58770368394: "the
factory reads [the init info's backend] to dispatch, so callers pass only the init info") and
vLLM's documentation, which calls ``WeightTransferTrainerFactory.trainer_init(init_info=...,
client=..., source=...)``. The worker factory is as at 047c993cc49c32e9b94f5bf826a9214e163eb982."""
import importlib


class _Registry:
    _registry: dict

    @classmethod
    def register_engine(cls, name, module_path_or_cls, class_name=None) -> None:
        if name in cls._registry:
            raise ValueError(f"Weight transfer engine '{name}' is already registered.")
        if isinstance(module_path_or_cls, str):
            if class_name is None:
                raise ValueError("class_name is required when registering with module path")
            module_path = module_path_or_cls
            cls._registry[name] = lambda: getattr(importlib.import_module(module_path), class_name)
        else:
            engine_cls = module_path_or_cls
            cls._registry[name] = lambda: engine_cls


class WeightTransferEngineFactory(_Registry):
    _registry: dict = {}

    @classmethod
    def create_engine(cls, config, vllm_config, device, model):
        if config.backend not in cls._registry:
            raise ValueError(f"Invalid weight transfer backend: {config.backend}. Available engines: {list(cls._registry)}")
        return cls._registry[config.backend]()(config, vllm_config, device, model)


class WeightTransferTrainerFactory(_Registry):
    _registry: dict = {}

    @classmethod
    def trainer_init(cls, init_info, *, client, source=None):
        backend = type(init_info).backend
        if backend not in cls._registry:
            raise ValueError(f"Invalid weight transfer backend: {backend}. Available trainer engines: {list(cls._registry.keys())}")
        return cls._registry[backend]().trainer_init(init_info, client=client, source=source)
