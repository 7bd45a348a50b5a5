"""deltacast as an SGLang custom weight loader: each tensor-parallel worker takes a version from a
deltacast fleet and applies it to its model.

Written against SGLang commit 01cc04e (python/sglang/srt/model_executor/model_runner.py,
``ModelRunner.update_weights_from_tensor``): when the request's ``load_format`` is listed in the
server's ``--custom-weight-loader``, every tensor-parallel worker calls that function as
``fn(model, named_tensors)``.

Start the server with ``--custom-weight-loader deltacast.sglang.load_weights``; each of its
processes joins the fleet as a worker configured by ``configure(...)`` or by the environment
(``DELTACAST_PARENTS``: endpoints separated by commas; ``DELTACAST_TRUST_KEYS``;
``DELTACAST_WORKER_ID``, to which each process adds ``-rank<N>``, default the host name;
``DELTACAST_STATE_DIR``; ``DELTACAST_TIMEOUT_S``). The trainer then
asks for a version by number instead of sending tensors::

    engine.update_weights_from_tensor(named_tensors=deltacast.sglang.request(version),
                                      load_format="deltacast.sglang.load_weights")

Nothing touches the model before the whole version verified: a version that does not arrive
intact raises ``UpdateError`` and leaves the model at its old version.
"""

from __future__ import annotations

import os
import socket
import threading
import weakref
from typing import Optional

from . import Error, Worker
from .engine import ModelUpdater, UpdateError

__all__ = ["UpdateError", "configure", "load_weights", "request", "shutdown"]

VERSION_TENSOR = "deltacast.version"

_lock = threading.Lock()
_config: dict = {}
_worker: Optional[Worker] = None
_updaters: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def configure(parents, *, worker_id: str = "", trust_keys=None, keys=None, parent_keys=None, state_dir: str = "",
              change_history: int = 4, timeout_s: float = 600.0) -> None:
    """Sets how this process joins the fleet (before the first update; else the environment is read)."""
    if isinstance(parents, str):
        parents = [parents]
    with _lock:
        if _worker is not None:
            raise Error("the worker is running already; configure() before the first update")
        _config.clear()
        _config.update(parents=list(parents), worker_id=worker_id, trust_keys=list(trust_keys or []), keys=keys,
                       parent_keys=list(parent_keys or []), state_dir=state_dir, change_history=change_history,
                       timeout_s=float(timeout_s))


def _from_environment() -> dict:
    parents = [p for p in os.environ.get("DELTACAST_PARENTS", "").split(",") if p]
    if not parents:
        raise Error("deltacast.sglang has no parents: call configure() or set DELTACAST_PARENTS")
    return dict(parents=parents, worker_id=os.environ.get("DELTACAST_WORKER_ID", ""),
                trust_keys=[k for k in os.environ.get("DELTACAST_TRUST_KEYS", "").split(",") if k], keys=None, parent_keys=[],
                state_dir=os.environ.get("DELTACAST_STATE_DIR", ""), change_history=4,
                timeout_s=float(os.environ.get("DELTACAST_TIMEOUT_S", "600")))


def _running_worker() -> Worker:
    global _worker
    with _lock:
        if _worker is None:
            c = _config or _from_environment()
            _config.update(c)
            # Stable across restarts (a worker finds its saved versions by id), one per process.
            worker_id = f"{c['worker_id'] or socket.gethostname()}-rank{_rank()}"
            _worker = Worker(worker_id, c["parents"], keys=c["keys"], parent_keys=c["parent_keys"], trust_keys=c["trust_keys"],
                             state_dir=c["state_dir"] or None, change_history=c["change_history"])
        return _worker


def _rank() -> int:
    """This process's rank among the server's workers (0 outside torch.distributed)."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def request(version: int):
    """The ``named_tensors`` a trainer passes to ``update_weights_from_tensor`` to ask for ``version``."""
    import torch

    if int(version) < 1:
        raise ValueError(f"versions count from 1, got {version}")
    return [(VERSION_TENSOR, torch.tensor([int(version)], dtype=torch.int64))]


def load_weights(model, named_tensors) -> None:
    """SGLang's custom weight loader: applies the version named in ``named_tensors`` to ``model``."""
    named = dict(named_tensors)
    if set(named) != {VERSION_TENSOR}:
        raise ValueError(f"deltacast.sglang.load_weights expects only {VERSION_TENSOR!r} (from deltacast.sglang.request), "
                         f"got {sorted(named)[:3]}")
    version = int(named[VERSION_TENSOR].reshape(-1)[0].item())
    worker = _running_worker()
    updater = _updaters.get(model)
    if updater is None:
        updater = _updaters[model] = ModelUpdater(model)
    updater.update(worker, version, timeout=_config.get("timeout_s", 600.0))


def shutdown() -> None:
    """Leaves the fleet (the worker says so to its parent)."""
    global _worker
    with _lock:
        if _worker is not None:
            _worker.close()
            _worker = None
