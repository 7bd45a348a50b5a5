"""Stand-in for python/sglang/srt/managers/tp_worker.py at SGLang commit
4f34e24af764d45c2dde4a17cadcdaa7d08a7248: ``update_weights_from_tensor`` deserializes its own
rank's entry of ``serialized_named_tensors`` and hands the list to the model runner."""
from sglang.srt.utils import MultiprocessingSerializer


class TpModelWorker:
    def __init__(self, model_runner, tp_rank: int):
        self.model_runner = model_runner
        self.tp_rank = tp_rank

    def update_weights_from_tensor(self, recv_req):
        success, message = self.model_runner.update_weights_from_tensor(
            named_tensors=MultiprocessingSerializer.deserialize(recv_req.serialized_named_tensors[self.tp_rank]),
            load_format=recv_req.load_format,
        )
        return success, message
