"""Run by test_engines.py with python/tests/fakes_newer first on the path: vLLM's newer trainer
API (a backend ClassVar on the init info, trainer_init(init_info, *, client, source)) drives an
engine of two ranks in processes of their own through the deltacast backend."""
import torch

import deltacast
import deltacast.vllm
from fake_models import llama_checkpoint, make_llama, reference, step
from vllm.distributed.weight_transfer import base
from vllm.distributed.weight_transfer.base import ModuleSource
from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
from vllm.entrypoints.llm import LLM
from vllm.plugins import load_general_plugins


def fingerprint(worker):
    return {n: bytes(p.detach().contiguous().view(torch.uint8).numpy()) for n, p in worker.model.named_parameters()}


class Finishing:
    """A client as the newer protocol has it: finish_weight_update(weight_version)."""

    def __init__(self, llm):
        self.llm, self.versions = llm, []

    def init_weight_transfer_engine(self, init_info):
        self.llm.init_weight_transfer_engine({"init_info": init_info})

    def start_weight_update(self):
        self.llm.start_weight_update()

    def update_weights(self, update_info):
        self.llm.update_weights({"update_info": update_info})

    def finish_weight_update(self, weight_version=None):
        self.versions.append(weight_version)
        self.llm.finish_weight_update()


def main():
    assert "backend" in base.TrainerInitInfo.__annotations__  # the newer API is the one on the path
    load_general_plugins()
    assert deltacast.vllm.DeltacastTrainerInitInfo.backend == "deltacast"
    sd = llama_checkpoint(seed=26)
    module = torch.nn.Module()
    for i, (name, t) in enumerate(sd.items()):
        module.register_parameter(f"p{i}", torch.nn.Parameter(t, requires_grad=False))
    names = dict(zip((f"p{i}" for i in range(len(sd))), sd))

    class Source(ModuleSource):  # checkpoint names, as a trainer's export gives them
        def __iter__(self):
            for attr, t in super().__iter__():
                yield names[attr], t

    llm = LLM(make_llama, llama_checkpoint(seed=83), tensor_parallel_size=2, weight_transfer_config={"backend": "deltacast"})
    client = Finishing(llm)
    engine = WeightTransferTrainerFactory.trainer_init(deltacast.vllm.DeltacastTrainerInitInfo(rank=0, worker_init={"worker_id": "newer"}),
                                                       client=client, source=Source(module))
    try:
        for version in (1, 2, 3):
            if version > 1:
                step(sd, 90 + version)
            engine.send_weights()
            got = llm.collective_rpc(fingerprint)
            for rank in range(2):
                want = {n: bytes(p.detach().contiguous().view(torch.uint8).numpy())
                        for n, p in reference(make_llama, rank, 2, sd).named_parameters()}
                assert got[rank] == want, (version, rank)
        assert client.versions == [f"{engine.publisher.run}:{v}" for v in (1, 2, 3)]
        print("versions 1 2 3 applied exactly")
    finally:
        engine.shutdown()
        llm.shutdown()


if __name__ == "__main__":
    main()
