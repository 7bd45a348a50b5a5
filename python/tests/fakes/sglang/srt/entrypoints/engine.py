"""Stand-in for python/sglang/srt/entrypoints/engine.py at SGLang commit
18bfdd16794a857cefaebc00a0964935b8d0a026, written from ``Engine``: it runs in the caller's
process, starts one scheduler process per tensor-parallel rank, and installs a SIGQUIT handler
that kills the whole process tree, the caller's own process included, when a scheduler fails
(``_set_envs_and_config``). ``update_weights_from_tensor(named_tensors, load_format=None,
flush_cache=True)`` serializes the named tensors once per rank with MultiprocessingSerializer
(raw bytes) and returns the schedulers' (success, message). ``shutdown()`` kills the children.

The tokenizer manager's part (python/sglang/srt/managers/tokenizer_communicator_mixin.py at
00096b5f4aa0a995aa1e076e43239bc5cf6fbdd0: send the request, wait for one reply per
data-parallel group, success when all succeed, messages joined with " | ") is
``TokenizerManager`` here, over pipes (every TP rank gets the request and answers; rank 0's
answer is the group's).

Differences from upstream: the model is ``make_model(rank, tp_size)`` loaded from ``checkpoint``
(the tests' own arguments; upstream: a model path); no detokenizer, no generation.
"""
import logging
import multiprocessing
import os
import signal
import socket

from sglang.srt.managers.io_struct import UpdateWeightsFromTensorReqInput
from sglang.srt.managers.scheduler import run_scheduler_process
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils import MultiprocessingSerializer, kill_process_tree

logger = logging.getLogger("sglang.srt.entrypoints.engine")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TokenizerManager:
    def __init__(self, conns):
        self.conns = conns

    def update_weights_from_tensor(self, obj: UpdateWeightsFromTensorReqInput):
        for conn in self.conns:
            conn.send(obj)
        outputs = [conn.recv() for conn in self.conns]
        replies = outputs[:1]  # fan_out = dp_size: the first TP rank of each data-parallel group answers
        return all(o.success for o in replies), " | ".join(o.message for o in replies)

    def call(self, fn):
        """The tests' look into every scheduler process: fn(scheduler) on each, their results."""
        for conn in self.conns:
            conn.send(fn)
        return [conn.recv() for conn in self.conns]


def _set_envs_and_config():
    def sigquit_handler(signum, frame):
        logger.error("Received sigquit from a child process. It usually means the child failed.")
        kill_process_tree(os.getpid())

    signal.signal(signal.SIGQUIT, sigquit_handler)


def _launch_subprocesses(server_args: ServerArgs, make_model, checkpoint, env=None):
    _set_envs_and_config()
    ctx = multiprocessing.get_context("spawn")
    init_method = f"tcp://127.0.0.1:{_free_port()}"
    conns, procs = [], []
    for tp_rank in range(server_args.tp_size):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=run_scheduler_process,
                        args=(server_args, tp_rank, init_method, child, make_model, checkpoint, dict(env or {})), daemon=True)
        p.start()
        conns.append(parent)
        procs.append(p)
    for conn in conns:
        if not conn.poll(120) or conn.recv() != "ready":
            raise RuntimeError("a scheduler did not start")
    return TokenizerManager(conns), procs


class Engine:
    def __init__(self, *, make_model, checkpoint: dict, env: dict | None = None, **kwargs):
        self.server_args = kwargs["server_args"] if "server_args" in kwargs else ServerArgs(**kwargs)
        self.tokenizer_manager, self._procs = _launch_subprocesses(self.server_args, make_model, checkpoint, env)

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache: bool = True):
        obj = UpdateWeightsFromTensorReqInput(
            serialized_named_tensors=[MultiprocessingSerializer.serialize(named_tensors) for _ in range(self.server_args.tp_size)],
            load_format=load_format,
            flush_cache=flush_cache,
        )
        return self.tokenizer_manager.update_weights_from_tensor(obj)

    def shutdown(self):
        for conn in self.tokenizer_manager.conns:
            try:
                conn.send(None)
            except OSError:
                pass
        for p in self._procs:
            p.join(10)
        kill_process_tree(os.getpid(), include_parent=False)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()
        return False
