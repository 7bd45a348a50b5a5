"""Stand-in for vllm/entrypoints/llm.py as the search index stores it (index id 1657674; the
index exposes no commit), written from ``LLM.collective_rpc(method, timeout=None, args=(),
kwargs=None) -> list`` (one result per worker; ``method`` a worker method's name, or a callable
taking the worker first) and ``LLM.init_weight_transfer_engine(request)`` /
``LLM.update_weights(request)``, which call ``collective_rpc("init_weight_transfer_engine",
kwargs={"init_info": ...})`` and ``collective_rpc("update_weights", kwargs={"update_info": ...})``
(a request is a dict with that key, or an object with that attribute). ``start_weight_update`` and
``finish_weight_update`` are the newer LLM's, which the router at
6fbea1171830682c53ecb7d3ae67495fa799e62f calls.

The engine's workers are separate processes, one per rank, in one torch.distributed (gloo)
group, each a vllm/v1/worker/gpu_worker.py Worker on ``cuda:<rank>`` (a device name only: the
models stay on the CPU). A worker's exception does not keep its type on the way back: as
vllm/v1/engine/core.py and core_client.py do it (the search index's ids 67065437639 and
70389998657; no commit exposed), the engine core records ``f"Call to {name} method failed:
{e}"`` and the client raises ``Exception(failure_message)``.
"""
import functools
import multiprocessing
import os
import socket

import torch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker_main(rank, world_size, init_method, conn, make_model, checkpoint, config, env):
    os.environ.update(env)
    from vllm.config import VllmConfig
    from vllm.config.parallel import ParallelConfig
    from vllm.config.weight_transfer import WeightTransferConfig
    from vllm.distributed.parallel_state import init_distributed_environment
    from vllm.plugins import load_general_plugins
    from vllm.v1.worker.gpu_worker import Worker

    try:
        init_distributed_environment(world_size, rank, init_method, local_rank=rank, backend="gloo")
        load_general_plugins()
        vllm_config = VllmConfig(parallel_config=ParallelConfig(tensor_parallel_size=world_size, rank=rank),
                                 weight_transfer_config=WeightTransferConfig(**config))
        worker = Worker(vllm_config, torch.device("cuda", rank), functools.partial(make_model, rank, world_size), checkpoint)
        worker.load_model()
    except BaseException as e:
        conn.send(("error", e))
        return
    conn.send(("ok", None))
    while True:
        message = conn.recv()
        if message is None:
            worker.shutdown()
            conn.send(("ok", None))
            return
        method, args, kwargs = message
        try:
            result = method(worker, *args, **kwargs) if callable(method) else getattr(worker, method)(*args, **kwargs)
            conn.send(("ok", result))
        except BaseException as e:
            conn.send(("error", e))


class LLM:
    """``make_model(rank, world_size)`` builds one rank's model; ``checkpoint`` is what it loads at
    start; ``weight_transfer_config`` the WeightTransferConfig fields; ``env`` goes into every
    worker's environment (CUDA_VISIBLE_DEVICES, say)."""

    def __init__(self, make_model, checkpoint: dict, *, tensor_parallel_size: int = 1, weight_transfer_config=None,
                 env: dict | None = None):
        ctx = multiprocessing.get_context("spawn")
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        self._conns, self._procs = [], []
        for rank in range(tensor_parallel_size):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker_main, args=(rank, tensor_parallel_size, init_method, child, make_model, checkpoint,
                                                       dict(weight_transfer_config or {}), dict(env or {})), daemon=True)
            p.start()
            self._conns.append(parent)
            self._procs.append(p)
        self._gather(timeout=120)

    def _gather(self, timeout, name="load_model"):
        results, error = [], None
        for conn in self._conns:
            if not conn.poll(timeout):
                raise TimeoutError(f"a worker did not answer within {timeout} s")
            status, value = conn.recv()
            if status == "error" and error is None:
                error = value
            results.append(value)
        if error is not None:
            raise Exception(f"Call to {name} method failed: {error}")
        return results

    def collective_rpc(self, method, timeout=None, args: tuple = (), kwargs: dict | None = None) -> list:
        for conn in self._conns:
            conn.send((method, tuple(args), dict(kwargs or {})))
        name = method if isinstance(method, str) else getattr(method, "__name__", "collective_rpc")
        return self._gather(3600 if timeout is None else timeout, name)

    def init_weight_transfer_engine(self, request) -> None:
        init_info = request["init_info"] if isinstance(request, dict) else request.init_info
        self.collective_rpc("init_weight_transfer_engine", kwargs={"init_info": init_info})

    def start_weight_update(self, include_draft: bool = False) -> None:
        self.collective_rpc("start_weight_update", kwargs={"include_draft": include_draft})

    def update_weights(self, request) -> None:
        update_info = request["update_info"] if isinstance(request, dict) else request.update_info
        self.collective_rpc("update_weights", kwargs={"update_info": update_info})

    def finish_weight_update(self) -> None:
        self.collective_rpc("finish_weight_update")

    def shutdown(self) -> None:
        for conn in self._conns:
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for conn, p in zip(self._conns, self._procs):
            if conn.poll(30):
                try:
                    conn.recv()
                except EOFError:
                    pass
            p.join(10)
            if p.is_alive():
                p.kill()
