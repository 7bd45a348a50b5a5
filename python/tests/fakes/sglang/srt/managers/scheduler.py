"""Stand-in for the SGLang scheduler process: ``run_scheduler_process`` as in
python/sglang/srt/managers/scheduler.py at SGLang commit 0003215cf1464f44b389cd0b18d0b4c56f2a3da6
(an exception anywhere in the scheduler is logged and answered with SIGQUIT to the parent, which
then kills the whole process tree), and ``update_weights_from_tensor`` as in
python/sglang/srt/managers/scheduler_update_weights_mixin.py at
c20e3fec6e8034282664271d008f57af91fda560 (the TP worker applies, the cache is flushed on success,
then every TP rank meets at a barrier of the TP CPU group). The dispatcher catches nothing.

Differences from upstream: requests come over a multiprocessing pipe (ZeroMQ there), every TP
rank gets each request from the engine (rank 0 broadcasts it there), and the model is built and
loaded from ``make_model(tp_rank, tp_size)`` and a checkpoint (the model loader there).
"""
import logging
import os
import signal
import traceback

import torch
import torch.distributed

from sglang.srt.managers.io_struct import UpdateWeightsFromTensorReqInput, UpdateWeightsFromTensorReqOutput
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.model_executor.model_runner import ModelRunner

logger = logging.getLogger("sglang.srt.managers.scheduler")


class Scheduler:
    def __init__(self, server_args, tp_rank: int, make_model, checkpoint: dict):
        self.server_args = server_args
        self.tp_rank = tp_rank
        self.tp_cpu_group = torch.distributed.group.WORLD
        model = make_model(tp_rank, server_args.tp_size)
        with torch.no_grad():
            model.load_weights(checkpoint.items())
        self.model_runner = ModelRunner(model, server_args, tp_rank)
        self.tp_worker = TpModelWorker(self.model_runner, tp_rank)
        self.draft_worker = None

    def flush_cache(self) -> bool:
        return True

    def update_weights_from_tensor(self, recv_req: UpdateWeightsFromTensorReqInput):
        worker = self.draft_worker or self.tp_worker
        success, message = worker.update_weights_from_tensor(recv_req)
        if success:
            if recv_req.flush_cache:
                flush_cache_success = self.flush_cache()
                assert flush_cache_success, "Cache flush failed after updating weights"
        else:
            logger.error(message)
        torch.distributed.barrier(group=self.tp_cpu_group)
        return UpdateWeightsFromTensorReqOutput(success=success, message=message)

    def _request_dispatcher(self, recv_req):
        if isinstance(recv_req, UpdateWeightsFromTensorReqInput):
            return self.update_weights_from_tensor(recv_req)
        if callable(recv_req):  # the tests' look into the process: fn(scheduler)
            return recv_req(self)
        raise ValueError(f"unknown request {type(recv_req).__name__}")

    def run_event_loop(self, conn):
        while True:
            recv_req = conn.recv()
            if recv_req is None:
                return
            conn.send(self._request_dispatcher(recv_req))


def run_scheduler_process(server_args, tp_rank: int, init_method: str, conn, make_model, checkpoint, env: dict):
    os.environ.update(env)
    parent_process = os.getppid()
    try:
        torch.distributed.init_process_group("gloo", init_method=init_method, world_size=server_args.tp_size, rank=tp_rank)
        scheduler = Scheduler(server_args, tp_rank, make_model, checkpoint)
        conn.send("ready")
        scheduler.run_event_loop(conn)
    except Exception:
        logger.error(f"Scheduler hit an exception: {traceback.format_exc()}")
        os.kill(parent_process, signal.SIGQUIT)
