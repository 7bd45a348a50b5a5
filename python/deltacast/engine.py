"""Applying verified versions to a rollout engine's model: what the vLLM and SGLang adapters share.

An update is transactional. ``ModelUpdater.update`` first waits for the whole version to verify
and plans every write from it; only then does it touch the model. A version that does not verify
(a corrupt chunk, a dead relay, a base that does not match) never becomes current in the worker,
so the wait ends in ``UpdateError`` and the model stays bit for bit at the version it had.

Two ways in:

- **In place**, for parameters the model holds under their checkpoint name, whole (same shape and
  dtype: norms, and unsliced layers): only the changed values are copied, with ``index_copy_`` on
  the parameter (only the changes cross PCIe).
- **Through** ``model.load_weights``, for everything else: the engine's own loader fuses (q/k/v,
  gate/up) and keeps its tensor-parallel slice. It gets the whole checkpoint tensor of every name
  that changed.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional

from . import Error, Version, Worker


class UpdateError(Error):
    """A version could not be applied. ``model_version`` is the version the model holds now (None:
    the model may be partly updated, and the next update reloads every tensor)."""

    def __init__(self, message: str, model_version: Optional[int]):
        super().__init__(message)
        self.model_version = model_version


class ModelUpdater:
    """Keeps one model at the versions a Worker verifies.

    ``load_weights``: the engine's loader, ``fn(iterable of (name, tensor))`` (default: the model's
    ``load_weights``). ``device``: where the model's parameters live (default: the first
    parameter's device).
    """

    def __init__(self, model, load_weights: Optional[Callable[[Iterable], object]] = None, device=None):
        import torch

        self.model = model
        self._load_weights = load_weights or model.load_weights
        params = dict(model.named_parameters())
        self._params = params
        self.device = device if device is not None else next(iter(params.values())).device if params else torch.device("cpu")
        self.version: Optional[int] = None  # the version the model holds (None: not one deltacast gave it)
        self.run: Optional[str] = None  # the run that version belongs to: a restarted trainer counts from 1 again
        self.last_stats: dict = {}

    def _direct(self, name: str, shape, dtype):
        """The parameter that holds checkpoint tensor ``name`` whole, if there is one."""
        p = self._params.get(name)
        if p is not None and tuple(p.shape) == tuple(shape) and p.dtype == dtype:
            return p
        return None

    def update(self, worker: Worker, version: int, timeout: Optional[float] = None) -> Version:
        """Brings the model to ``version`` (or the newest verified after it) and returns it."""
        try:
            v = worker.wait(version, timeout=timeout)
        except TimeoutError as e:
            raise UpdateError(f"version {version} did not verify within {timeout} s; the model is unchanged at version "
                              f"{self.version}", self.version) from e
        except Error as e:
            raise UpdateError(f"version {version}: {e}; the model is unchanged at version {self.version}", self.version) from e
        if v.number == self.version and v.run == self.run:
            return v
        plan = self._plan(v)
        self._apply(v, plan)
        return v

    def _plan(self, v: Version):
        """Every write the update makes, read from the verified version before the model is touched:
        (in-place patches, in-place whole copies, names to load through load_weights)."""
        patches, copies, loads = [], [], []
        since = self.version if v.run == self.run else None  # another run's versions share no history
        sparse = since is not None and since < v.number and v._native.changes_since <= since
        if sparse:
            views = dict(v.tensors())
            for name, idx, values in v.patches(since=since):
                if idx.numel() == 0:
                    continue
                p = self._direct(name, views[name].shape, views[name].dtype)
                if p is not None:
                    patches.append((p, idx, values))
                else:
                    loads.append(name)
        else:
            for name, t in v.tensors():
                p = self._direct(name, t.shape, t.dtype)
                if p is not None:
                    copies.append((p, t))
                else:
                    loads.append(name)
        return patches, copies, loads

    def _apply(self, v: Version, plan) -> None:
        import torch

        patches, copies, loads = plan
        before = self.version
        self.version = self.run = None  # until every write is done
        try:
            with torch.no_grad():
                if loads:
                    # Copies, never views of the verified image: a loader may write into what it is given.
                    self._load_weights((name, t.to(self.device, copy=True)) for name, t in v.tensors(loads))
                for p, idx, values in patches:
                    p.data.view(-1).index_copy_(0, idx.to(p.device), values.to(p.device))
                for p, t in copies:
                    p.data.copy_(t)
        except Exception as e:
            raise UpdateError(f"applying version {v.number} over version {before} failed part way: {e}; "
                              "the next update reloads every tensor", None) from e
        self.version, self.run = v.number, v.run
        self.last_stats = {
            "version": v.number,
            "from": before,
            "patched_tensors": len(patches),
            "patched_values": sum(int(idx.numel()) for _, idx, _ in patches),
            "copied_tensors": len(copies),
            "loaded_tensors": len(loads),
        }
