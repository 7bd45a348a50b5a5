"""deltacast as an SGLang custom weight loader: every tensor-parallel rank of a server applies
exactly the version the trainer asked for, or all keep the one they had, and nothing ever raises
into SGLang.

Written against SGLang's update path as of commit 0005834cdb2a5b7472789ccbf0d3361b5cf853b8
(python/sglang/srt/model_executor/model_runner.py, ``ModelRunner.update_weights_from_tensor``: when
the request's ``load_format`` is listed in ``--custom-weight-loader``, each tensor-parallel rank
calls that function as ``fn(model, named_tensors)``), with the request as
python/sglang/srt/managers/io_struct.py at 001067fffe33427bee0ed2f007fb7551a1d76b44 defines it and
the serializer of python/sglang/srt/utils/common.py at 004f0c7a8d398a9c4b6844c1d8071502fa88e78c.

SGLang does not catch what a loader raises: the scheduler process signals its parent, which kills
the whole server (python/sglang/srt/managers/scheduler.py at
0003215cf1464f44b389cd0b18d0b4c56f2a3da6). So ``load_weights`` never raises: a version that does
not arrive or does not apply leaves the model at its old version, is logged once, and goes to the
trainer through the fleet ledger (``Publisher.wait_ready`` names the worker and its error).

Start the server with ``--custom-weight-loader deltacast.sglang.load_weights``; each of its
processes joins the fleet as a worker configured by ``configure(...)`` or by the environment
(``DELTACAST_PARENTS``: endpoints separated by commas; ``DELTACAST_TRUST_KEYS``;
``DELTACAST_WORKER_ID``, to which each rank adds ``-r<rank>``; default <host>-sglang-gpu<GPU>;
``DELTACAST_STATE_DIR``; ``DELTACAST_TIMEOUT_S``). The trainer then asks for a version instead of
sending tensors, with what ``request()`` (an Engine in the trainer's process) or
``serialized_request()`` (the HTTP route, from anywhere) builds.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import pickle
import threading
import weakref
from typing import Optional

from . import DEFAULT_CHANGE_HISTORY, Error, Request, Worker, attach
from .engine import ModelUpdater, UpdateError, default_group, default_worker_id

__all__ = ["REQUEST_TENSOR", "UpdateError", "configure", "load_weights", "request", "serialized_request", "shutdown"]

REQUEST_TENSOR = "deltacast.request"
REQUEST_BYTES_MAX = 4096  # a request is a short JSON text

_log = logging.getLogger("deltacast")
_lock = threading.Lock()
_config: dict = {}
_worker: Optional[Worker] = None
_updaters: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def configure(parents=None, *, worker_id: str = "", trust_keys=None, keys=None, parent_keys=None, state_dir: str = "",
              change_history: int = DEFAULT_CHANGE_HISTORY, change_history_bytes: int = 0, timeout_s: float = 600.0, placement: bool = True,
              attach: str = "") -> None:
    """Sets how this process joins the fleet (before the first update; else the environment is read).
    ``attach``: the socket of a worker this host runs with ``--share``; each rank reads its versions
    (``deltacast.attach``) instead of running a worker, and ``parents`` are not needed."""
    if isinstance(parents, str):
        parents = [parents]
    with _lock:
        if _worker is not None:
            raise Error("the worker is running already; configure() before the first update")
        _config.clear()
        if not parents and not attach:
            raise Error("deltacast.sglang needs parents, or a host's worker to attach to")
        _config.update(parents=list(parents or []), attach=str(attach), worker_id=worker_id, trust_keys=list(trust_keys or []), keys=keys,
                       parent_keys=list(parent_keys or []), state_dir=state_dir, change_history=change_history,
                       change_history_bytes=change_history_bytes, timeout_s=float(timeout_s), placement=placement)


def _from_environment() -> dict:
    parents = [p for p in os.environ.get("DELTACAST_PARENTS", "").split(",") if p]
    shared = os.environ.get("DELTACAST_ATTACH", "")
    if not parents and not shared:
        raise Error("deltacast.sglang has no parents: call configure() or set DELTACAST_PARENTS (or DELTACAST_ATTACH)")
    return dict(parents=parents, attach=shared, worker_id=os.environ.get("DELTACAST_WORKER_ID", ""),
                trust_keys=[k for k in os.environ.get("DELTACAST_TRUST_KEYS", "").split(",") if k], keys=None, parent_keys=[],
                state_dir=os.environ.get("DELTACAST_STATE_DIR", ""), change_history=DEFAULT_CHANGE_HISTORY, change_history_bytes=0,
                timeout_s=float(os.environ.get("DELTACAST_TIMEOUT_S", "600")), placement=True)


def _rank() -> int:
    """This process's rank among the server's (0 outside torch.distributed)."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _running_worker(model) -> Worker:
    global _worker
    with _lock:
        if _worker is None:
            c = _config or _from_environment()
            _config.update(c)
            rank = _rank()
            device = next(iter(model.parameters())).device
            worker_id = f"{c['worker_id']}-r{rank}" if c["worker_id"] else default_worker_id("sglang", device, 0, rank)
            state_dir = os.path.join(c["state_dir"], worker_id) if c["state_dir"] else None
            if c.get("attach"):
                _worker = attach(c["attach"])
                return _worker
            _worker = Worker(worker_id, c["parents"], keys=c["keys"], parent_keys=c["parent_keys"], trust_keys=c["trust_keys"],
                             state_dir=state_dir, change_history=c["change_history"], change_history_bytes=c["change_history_bytes"])
        return _worker


def request(req) -> list:
    """The ``named_tensors`` that ask SGLang's ranks for exactly ``req`` (a Request, {"version": N,
    "run": R} or N): for ``Engine.update_weights_from_tensor(named_tensors=...,
    load_format="deltacast.sglang.load_weights")``."""
    import torch

    text = json.dumps(Request.of(req).as_dict()).encode()
    return [(REQUEST_TENSOR, torch.frombuffer(bytearray(text), dtype=torch.uint8))]


def serialized_request(req, tp_size: int) -> list[str]:
    """``serialized_named_tensors`` for the HTTP route ``/update_weights_from_tensor``: one base64
    text per tensor-parallel rank. The tensor is pickled by value (plain pickle, not the fd-passing
    ForkingPickler an Engine uses), so a server in another process or on another host loads it
    with SGLang's own MultiprocessingSerializer."""
    if int(tp_size) < 1:
        raise ValueError(f"tp_size must be at least 1, got {tp_size}")
    buf = io.BytesIO()
    pickle.Pickler(buf, protocol=pickle.DEFAULT_PROTOCOL).dump(request(req))
    text = base64.b64encode(buf.getvalue()).decode()
    return [text] * int(tp_size)


def _parse(named_tensors) -> Request:
    """The request in ``named_tensors``; ValueError for anything but what request() builds."""
    named = list(named_tensors)
    if len(named) != 1 or named[0][0] != REQUEST_TENSOR:
        raise ValueError(f"deltacast.sglang.load_weights expects only {REQUEST_TENSOR!r} (from deltacast.sglang.request), "
                         f"got {[n for n, _ in named][:3]}")
    tensor = named[0][1]
    if tensor.numel() > REQUEST_BYTES_MAX:
        raise ValueError(f"a deltacast request is at most {REQUEST_BYTES_MAX} bytes, got {tensor.numel()}")
    try:
        return Request.of(json.loads(bytes(tensor.reshape(-1).cpu().numpy().tobytes()).decode()))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"not a deltacast request: {e}") from e


def load_weights(model, named_tensors) -> None:
    """SGLang's custom weight loader: applies exactly the version named in ``named_tensors`` to
    ``model``, with every other rank of the server, or keeps the version it has. Never raises."""
    req = None
    try:
        req = _parse(named_tensors)
        worker = _running_worker(model)
        updater = _updaters.get(model)
        if updater is None:
            updater = _updaters[model] = ModelUpdater(model, group=default_group(), placement=_config.get("placement", True))
        updater.update(worker, req, timeout=_config.get("timeout_s", 600.0))
        worker.report_model(updater.run, updater.version)
    except Exception as e:  # SGLang would take the whole server down
        _failed(model, req, e)


def _failed(model, req: Optional[Request], e: Exception) -> None:
    updater = _updaters.get(model)
    held = "no version deltacast gave it" if updater is None or updater.version is None else f"version {updater.version} of run {updater.run}"
    message = str(e) if isinstance(e, UpdateError) else f"{req or 'the request'}: {type(e).__name__}: {e}. The model keeps {held}"
    if _rank() == 0:  # every rank knows the outcome; one says it
        _log.error("deltacast: %s", message)
    if _worker is not None:
        model_version = getattr(e, "model_version", updater.version if updater else None)
        model_run = getattr(e, "model_run", updater.run if updater else None)
        try:
            _worker.report_model(model_run, model_version, error=message, failed=req)
        except Error:
            pass  # the worker is closed: nothing to tell


def shutdown() -> None:
    """Leaves the fleet (the worker says so to its parent)."""
    global _worker
    with _lock:
        if _worker is not None:
            _worker.close()
            _worker = None
        _updaters.clear()
