"""Stand-in for vllm/distributed/weight_transfer/factory.py at vLLM commit
047c993cc49c32e9b94f5bf826a9214e163eb982, written from that file: a registry of worker engines by
backend name, and (PR "Stateful Trainer Send [1/N]") a separate one of trainer engines, both
lazily imported from (module path, class name). Registering a name twice raises ValueError; an
unknown backend raises ValueError naming the registered ones."""
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
            module_path = module_path_or_cls
            cls._registry[name] = lambda: getattr(importlib.import_module(module_path), class_name)
        else:
            engine_cls = module_path_or_cls
            cls._registry[name] = lambda: engine_cls

    @classmethod
    def create_engine(cls, config, vllm_config, device, model):
        if config.backend not in cls._registry:
            raise ValueError(f"Invalid weight transfer backend: {config.backend}. Available engines: {list(cls._registry)}")
        return cls._registry[config.backend]()(config, vllm_config, device, model)


class WeightTransferTrainerFactory:
    _registry: dict = {}

    @classmethod
    def register_engine(cls, name, module_path_or_cls, class_name=None) -> None:
        if name in cls._registry:
            raise ValueError(f"Weight transfer trainer engine '{name}' is already registered.")
        if isinstance(module_path_or_cls, str):
            if class_name is None:
                raise ValueError("class_name is required when registering with module path")
            module_path = module_path_or_cls
            cls._registry[name] = lambda: getattr(importlib.import_module(module_path), class_name)
        else:
            engine_cls = module_path_or_cls
            cls._registry[name] = lambda: engine_cls

    @classmethod
    def trainer_init(cls, backend, config, init_info, *, client, source):
        if backend not in cls._registry:
            raise ValueError(f"Invalid weight transfer backend: {backend}. Available trainer engines: {list(cls._registry.keys())}")
        engine_cls = cls._registry[backend]()
        return engine_cls.trainer_init(config=config, init_info=init_info, client=client, source=source)
