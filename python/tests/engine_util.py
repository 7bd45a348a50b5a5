"""What the engine adapter tests share: vLLM workers as its GPU worker makes them, in this
process, and how they are driven."""

import time

import torch

from fake_models import same_as_whole_load
from vllm.config import SpeculativeConfig, VllmConfig
from vllm.config.parallel import ParallelConfig
from vllm.config.weight_transfer import WeightTransferConfig
from vllm.plugins import load_general_plugins
from vllm.v1.worker.gpu_worker import Worker as GpuWorker


class Rank:
    """One rank of a vLLM engine in this process: the GPU worker (fakes/vllm/v1/worker), its model
    made by ``make(rank, tp_size)`` and loaded from ``checkpoint`` at start, the deltacast backend."""

    def __init__(self, make, checkpoint, parents, tp_size=1, rank=0, *, gpu=None, reload_mode="layerwise", draft=None, **init):
        load_general_plugins()
        self.make, self.tp_size, self.rank = make, tp_size, rank
        config = VllmConfig(parallel_config=ParallelConfig(tensor_parallel_size=tp_size, rank=rank),
                            weight_transfer_config=WeightTransferConfig(backend="deltacast", reload_mode=reload_mode),
                            speculative_config=SpeculativeConfig() if draft else None)
        device = torch.device("cuda", rank if gpu is None else gpu)  # a name only: the model stays on the CPU
        self.worker = GpuWorker(config, device, lambda: make(rank, tp_size), {n: t.clone() for n, t in checkpoint.items()},
                                draft_model_factory=draft)
        self.worker.load_model()
        if parents is not None:
            self.worker.init_weight_transfer_engine({"parents": parents, **init})

    @property
    def engine(self):
        return self.worker.weight_transfer_engine

    @property
    def model(self):
        return self.worker.model

    @property
    def stats(self) -> dict:
        return self.engine.updater.last_stats

    def update(self, request, timeout_s=30.0):
        """One update as vLLM's worker runs it: start, update, finish."""
        self.worker.start_weight_update()
        self.worker.update_weights({**request, "timeout_s": timeout_s})
        self.worker.finish_weight_update()

    def wrong(self, checkpoint) -> list:
        """Parameters that differ from the engine's own whole load of `checkpoint`."""
        return same_as_whole_load(self.model, self.make, self.rank, self.tp_size, checkpoint)

    def close(self):
        self.worker.shutdown()


def params_of(model) -> dict:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def unchanged(model, before) -> bool:
    return all(torch.equal(p.detach().contiguous().view(torch.uint8), before[name].contiguous().view(torch.uint8))
               for name, p in model.named_parameters())


def eventually(condition, timeout_s=20.0) -> bool:
    """Whether `condition()` turns true within timeout_s (reports travel up the tree meanwhile)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
