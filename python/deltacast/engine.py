"""Applying verified versions to a rollout engine's model: what the vLLM and SGLang adapters share.

An update names one version of one run (a ``Request``), and every rank of the engine applies
exactly that version or none does:

1. **Prepare** (nothing touched). Each rank gets exactly the version asked for from its worker
   (``Worker.version``: waiting for it to verify, or reading it back from the change history when
   newer versions came meanwhile) and plans every write. An older version than the model holds,
   or a version of a run the worker left, is refused here.
2. **Agree.** The ranks exchange their outcome (``torch.distributed.all_gather_object`` over the
   engine's group). If any rank could not prepare, every rank raises ``UpdateError`` and keeps
   the version it had.
3. **Commit.** Each rank writes; a rank whose writes fail puts back what it wrote. The ranks
   agree once more: if any failed, those that succeeded go back to the version they had too.

Writes go where the engine's own loader puts each value. ``Placement.derive`` runs the loader
once on index-valued tensors into float64 shadows of the parameters, twice with two different
encodings, and records for each checkpoint tensor the runs of parameter elements its values land
in (fused q/k/v and gate/up rows, tensor-parallel slices, transposes, padded vocabularies). A
version's changes then become in-place writes of just the changed values into this rank's
parameters. A loader that transforms values (scaling, quantization, repacking) has no exact map:
the probe sees it, or the check of the map against the first whole load does, and the changed
tensors go through the engine's own reload path instead (``reload``: vLLM's layerwise reload;
otherwise the loader itself, as the engine's own update does). A name-and-shape guess is never
used.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
import re
import socket
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

import numpy as np

from . import Error, Request, Version, VersionGone, Worker, _native, _torch_dtype

__all__ = ["ModelUpdater", "Placement", "Request", "UpdateError", "default_group", "default_worker_id"]

_log = logging.getLogger("deltacast")

# What the placement probe may allocate: float64 shadows of every parameter of the rank, the
# decoded first probe, and the largest checkpoint tensor as index values.
PLACEMENT_PROBE_BYTES_MAX = 64 << 30


def _physical_gpu(index: int) -> str:
    """The host's name for CUDA device `index` of this process: its entry in CUDA_VISIBLE_DEVICES
    (an index or a UUID), or the index itself."""
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    name = visible[index] if index < len(visible) else str(index)
    return re.sub(r"[^A-Za-z0-9._-]", "-", name)


def default_worker_id(engine: str, device, dp_rank: int, rank: int) -> str:
    """<host>-<engine>-gpu<physical GPU>: two engine instances on one host hold different GPUs, and
    a restarted instance gets its GPUs back. Off a GPU: <host>-<engine>-<device>-dp<N>-r<M>."""
    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())
    if getattr(device, "type", None) == "cuda":
        return f"{host}-{engine}-gpu{_physical_gpu(device.index or 0)}"
    return f"{host}-{engine}-{getattr(device, 'type', 'cpu')}-dp{dp_rank}-r{rank}"


def default_group():
    """torch.distributed's default group when this process is one of several ranks, else None."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.group.WORLD
    return None


class UpdateError(Error):
    """A version could not be applied. ``model_version`` and ``model_run`` are what the model holds
    now (``model_version`` None: the model may be partly updated, and the next update reloads every
    tensor)."""

    def __init__(self, message: str, model_version: Optional[int], model_run: Optional[str] = None):
        super().__init__(message)
        self.model_version = model_version
        self.model_run = model_run

    def __reduce__(self):  # an engine passes it between processes (vLLM's workers, Ray)
        return (UpdateError, (str(self), self.model_version, self.model_run))


@dataclass
class _Layer:
    """Runs of one checkpoint tensor that do not overlap, sorted by source: element src + k (up to
    end) of the tensor lands at element dst + k * stride of parameter `param` (int64 arrays)."""

    src: object
    end: object
    dst: object
    stride: object
    param: object


class Placement:
    """Where each checkpoint value lands in one rank's parameters, as the engine's own loader puts it.

    ``exact`` False means no such map exists (``reason`` says why): the loader transforms values,
    or could not load index values at all. ``loadable`` False means the loader cannot load the
    checkpoint into this model at all, not even its own values (a draft model given the target's
    checkpoint): nothing may be loaded into it."""

    def __init__(self, exact: bool, reason: str = "", params=None, names=None, layers=None, loadable: bool = True):
        self.exact = exact
        self.reason = reason
        self.loadable = loadable
        self.params = params or []  # the rank's parameters, by index
        self.param_names = names or []
        self._layers: dict[str, list[_Layer]] = layers or {}
        self._ranges: dict = {}  # name -> the element ranges of it that land on this rank (held())

    @classmethod
    def none(cls, reason: str) -> "Placement":
        return cls(False, reason)

    @classmethod
    def derive(cls, model, load_weights: Callable[[Iterable], object], table, probe_bytes_max: int = PLACEMENT_PROBE_BYTES_MAX) -> "Placement":
        """Runs ``load_weights`` on index values of every checkpoint tensor in ``table`` ((name,
        shape, torch dtype) in image order) into float64 shadows of ``model``'s parameters, twice,
        and reads where each value went. The parameters are given back their own tensors after."""
        import torch

        named, seen = [], set()
        for name, p in model.named_parameters():
            if id(p) not in seen:
                seen.add(id(p))
                named.append((name, p))
        counts = [math.prod(shape) for _, shape, _ in table]
        starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)
        total = int(starts[-1])
        if total + 3 >= 2**52:
            return cls.none(f"{total} checkpoint values do not fit in the float64 index of the probe")
        need = 16 * sum(p.numel() for _, p in named) + 8 * max(counts, default=0)
        if need > probe_bytes_max:
            return cls.none(f"the placement probe needs {need} bytes, above its bound of {probe_bytes_max}")
        for name, p in named:
            if not p.data.is_contiguous():
                return cls.none(f"parameter {name} is not contiguous")
        saved = [p.data for _, p in named]
        decoded = []
        try:
            # Two encodings of the global index g: g + 1 and 2g + 3. A value the loader only moves
            # decodes to the same g from both; one it transforms does not, and a value the loader
            # writes whatever it is given (zeros in padding) is the same raw value in both.
            for slope, offset in ((1.0, 1.0), (2.0, 3.0)):
                for _, p in named:
                    p.data = torch.full(tuple(p.shape), -1.0, dtype=torch.float64)

                def probe(slope=slope, offset=offset):
                    for (name, shape, _), start, count in zip(table, starts, counts):
                        values = torch.arange(int(start), int(start) + count, dtype=torch.float64)
                        yield name, (values * slope + offset).reshape(tuple(shape))

                with torch.no_grad():
                    load_weights(probe())
                decoded.append([p.data.reshape(-1) for _, p in named])
        except Exception as e:  # the loader cannot take index values (it checks dtypes, quantizes, ...)
            failed = f"{type(e).__name__}: {e}"
        else:
            failed = None
        finally:
            for (_, p), data in zip(named, saved):
                p.data = data
        if failed is not None:
            # Can it load this checkpoint at all? The same load with zeros of every tensor's own
            # dtype, into shadows of every parameter's own dtype.
            unloadable = cls._dry_load(named, load_weights, table)
            if unloadable:
                return cls(False, f"the engine's loader cannot load this checkpoint into this model: {unloadable}", loadable=False)
            return cls.none(f"the engine's loader could not load index values: {failed}")
        runs = []
        for index, ((name, _), a, b) in enumerate(zip(named, *decoded)):
            constant = a == b
            ia, ib = a - 1.0, (b - 3.0) / 2.0
            mapped = ~constant & (ia == ib) & (ia >= 0) & (ia < total) & (ia == torch.floor(ia))
            stray = int((~(constant | mapped)).sum())
            if stray:
                return cls.none(f"{stray} values of parameter {name} are not checkpoint values the loader copied: it transforms them")
            source = torch.where(mapped, ia, torch.full_like(ia, -1.0)).to(torch.int64).numpy()
            t, src, length, dst, stride = _native.placement_runs(source, starts[:-1])
            runs.append((t, src, length, dst, stride, np.full(len(t), index, dtype=np.int64)))
        del decoded
        return cls(True, "", [p for _, p in named], [n for n, _ in named], cls._layers_of(runs, [n for n, _, _ in table]))

    @staticmethod
    def _dry_load(named, load_weights, table) -> Optional[str]:
        """Why ``load_weights`` cannot load zeros of every checkpoint tensor into shadows of the
        parameters (None: it can). The parameters are given back their own tensors after."""
        import torch

        saved = [p.data for _, p in named]
        try:
            for _, p in named:
                p.data = torch.zeros(tuple(p.shape), dtype=p.dtype)
            with torch.no_grad():
                load_weights((name, torch.zeros(shape, dtype=dtype)) for name, shape, dtype in table)
            return None
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        finally:
            for (_, p), data in zip(named, saved):
                p.data = data

    @staticmethod
    def _layers_of(runs, names) -> dict:
        """Per checkpoint tensor, its runs in layers that do not overlap (one, unless a value lands
        in several places)."""
        if not runs:
            return {}
        t, src, length, dst, stride, param = (np.concatenate(col) for col in zip(*runs))
        order = np.lexsort((src, t))
        t, src, length, dst, stride, param = (a[order] for a in (t, src, length, dst, stride, param))
        bounds = np.searchsorted(t, np.arange(len(names) + 1))
        out = {}
        for ti, name in enumerate(names):
            lo, hi = bounds[ti], bounds[ti + 1]
            if lo == hi:
                continue  # no value of it lands on this rank
            s, e = src[lo:hi], src[lo:hi] + length[lo:hi]
            if hi - lo == 1 or np.all(s[1:] >= np.maximum.accumulate(e)[:-1]):
                groups = [np.arange(lo, hi)]
            else:  # a value in several places: first-fit into layers that do not overlap
                ends, groups = [], []
                for k in range(lo, hi):
                    for g, end in enumerate(ends):
                        if src[k] >= end:
                            groups[g].append(k)
                            ends[g] = src[k] + length[k]
                            break
                    else:
                        groups.append([k])
                        ends.append(src[k] + length[k])
                groups = [np.array(g) for g in groups]
            out[name] = [_Layer(*(np.ascontiguousarray(a[g]) for a in (src, src + length, dst, stride, param))) for g in groups]
        return out

    def holds(self, name: str) -> bool:
        """Whether any value of checkpoint tensor ``name`` lands on this rank."""
        return name in self._layers

    def held(self, name: str):
        """The elements of checkpoint tensor ``name`` that land on this rank, as an (n, 2) uint64
        array of [first, last) ranges, ascending and apart (empty: none), made once."""
        ranges = self._ranges.get(name)
        if ranges is None:
            layers = self._layers.get(name, [])
            if not layers:
                ranges = np.zeros((0, 2), dtype=np.uint64)
            else:
                src = np.concatenate([layer.src for layer in layers])
                end = np.concatenate([layer.end for layer in layers])
                order = np.argsort(src, kind="stable")
                src, end = src[order], np.maximum.accumulate(end[order])
                # A range starts where the one before ended before it; merged ranges end at the last end.
                starts = np.concatenate([[True], src[1:] > end[:-1]])
                first = src[starts]
                last = np.concatenate([end[np.flatnonzero(starts)[1:] - 1], end[-1:]])
                ranges = np.stack([first, last], axis=1).astype(np.uint64)
            self._ranges[name] = ranges
        return ranges

    def writes(self, name: str, idx, values):
        """The in-place writes that turn ``(idx, values)``, changed elements of checkpoint tensor
        ``name`` (flat, ascending), into this rank's parameters: [(param index, destination flat
        indices, values)], and how many of the changed elements land on this rank."""
        import torch

        layers = self._layers.get(name)
        if not layers or idx.numel() == 0:
            return [], 0
        out, landed = [], None
        idx_np = idx.numpy()
        for layer in layers:
            at, dst, owner = _native.placement_hits(idx_np, layer.src, layer.end, layer.dst, layer.stride, layer.param)
            if len(at) == 0:
                continue
            at, dst, owner = torch.from_numpy(at), torch.from_numpy(dst), torch.from_numpy(owner)
            vals = values if len(at) == idx.numel() else values[at]
            landed = at if landed is None else torch.cat([landed, at])
            first = int(owner[0])
            if bool((owner == first).all()):  # the usual case: one parameter per checkpoint tensor
                out.append((first, dst, vals))
                continue
            for o in torch.unique(owner).tolist():
                mine = owner == o
                out.append((o, dst[mine], vals[mine]))
        count = 0 if landed is None else (len(landed) if len(layers) == 1 else int(torch.unique(landed).numel()))
        return out, count

    def mismatches(self, version: Version) -> list[str]:
        """The parameters whose mapped elements do not hold what the map says ``version`` puts
        there: the check of the map against a whole load by the engine's own loader."""
        import torch

        wrong = set()
        for name, tensor in version.tensors([n for n in self._layers if n in set(version.names())]):
            flat = tensor.reshape(-1)
            for numpy_layer in self._layers[name]:
                layer = _Layer(*(torch.from_numpy(a) for a in vars(numpy_layer).values()))
                lengths = layer.end - layer.src
                run = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
                k = torch.arange(int(lengths.sum())) - torch.repeat_interleave(torch.cumsum(lengths, 0) - lengths, lengths)
                src = layer.src[run] + k
                dst = layer.dst[run] + k * layer.stride[run]
                owners = layer.param[run]
                for owner in torch.unique(owners).tolist():
                    mine = owners == owner
                    p = self.params[owner].data.reshape(-1)
                    got = p[dst[mine].to(p.device)].cpu()
                    if not torch.equal(_bits(got), _bits(flat[src[mine]].to(p.dtype))):
                        wrong.add(self.param_names[owner])
        return sorted(wrong)


def _bits(t):
    """A tensor's bits as integers of its element size (so NaN compares equal to itself)."""
    import torch

    size = t.element_size()
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size])


@dataclass
class _Plan:
    """Every write one update makes, read from the verified version before the model is touched."""

    version: Version
    whole: bool = False  # every tensor through the loader (first version, another run, history gone)
    reload: bool = False  # ... inside the engine's reload hooks
    loads: list = field(default_factory=list)  # names whose whole tensors go through the loader
    writes: list = field(default_factory=list)  # (param index, flat indices, values) in place
    written: list = field(default_factory=list)  # names of the checkpoint tensors the writes come from
    since: Optional[int] = None  # the version the writes start from (the one the model holds)
    changed: int = 0  # checkpoint values that changed
    in_slice: int = 0  # ... of which land on this rank


@dataclass
class _Undo:
    writes: list = field(default_factory=list)  # (param, flat indices on its device, old values)
    # Or, when the worker's history holds the held version's values: the plan whose writes
    # that version's values put back.
    rewrite: Optional[_Plan] = None
    loads: list = field(default_factory=list)  # names loaded (put back by loading the held version's)
    whole: bool = False


_POOL_LOCK = threading.Lock()
_POOL: Optional[ThreadPoolExecutor] = None


def _pool() -> ThreadPoolExecutor:
    """Threads that read a version's changes, tensor by tensor (the native calls let go of the GIL)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1), thread_name_prefix="deltacast-plan")
        return _POOL


class ModelUpdater:
    """Keeps one rank's model at the versions it is asked for.

    ``load_weights``: the engine's loader, ``fn(iterable of (name, tensor))`` (default: the model's
    ``load_weights``). ``group``: the torch.distributed group of the engine's ranks that apply
    versions together (None: this rank alone). ``reload``: the engine's reload path for loaders
    that post-process, an object with ``begin()`` and ``end()`` run around a whole load (None: the
    loader alone). ``placement``: derive the map of in-place writes (False: every changed tensor
    goes through the loader). ``device``: where loaded tensors are put before the loader gets them
    (default: the first parameter's device).
    """

    def __init__(self, model, load_weights: Optional[Callable[[Iterable], object]] = None, *, group=None, reload=None,
                 placement: bool = True, device=None, placement_probe_bytes_max: int = PLACEMENT_PROBE_BYTES_MAX):
        import torch

        self.model = model
        self._load_weights = load_weights or model.load_weights
        self.group = group
        self.reload = reload
        first = next(iter(model.parameters()), None)
        self.device = device if device is not None else first.device if first is not None else torch.device("cpu")
        self.version: Optional[int] = None  # the version the model holds (None: not one deltacast gave it)
        self.run: Optional[str] = None  # the run that version belongs to: a restarted trainer counts from 1 again
        self.last_stats: dict = {}
        self._derive = placement
        self.placement: Placement = Placement.none("not derived yet")
        self._table = None  # the checkpoint table the placement was derived for
        self._probe_bytes_max = placement_probe_bytes_max

    # ---- the transaction ----------------------------------------------------------------------

    def update(self, worker: Worker, request, timeout: Optional[float] = None) -> Version:
        """Brings the model to exactly the version ``request`` names (a Request, {"version": N,
        "run": R} or N), together with the other ranks of ``group``; returns it. Raises
        UpdateError, with what the model holds, when any rank could not."""
        req = Request.of(request)
        plan, error = None, None
        try:
            plan = self._prepare(worker, req, timeout)
        except Exception as e:
            error = e
        self._agree(req, error, "could not get it")
        undo, error = None, None
        if plan is not None:  # None: the model holds it already
            undo = _Undo(whole=plan.whole)
            try:
                self._commit(plan, undo)
            except Exception as e:
                error = e
                self._rollback(worker, undo)
        try:
            self._agree(req, error, "could not apply it")
        except UpdateError:
            if undo is not None and error is None:  # this rank applied it, another did not: back to the version held
                self._rollback(worker, undo)
            raise
        if plan is None:
            return worker.version(req.version, self.run, timeout=0)
        self._finish(worker, plan)
        return plan.version

    def _agree(self, req: Request, error: Optional[BaseException], what: str) -> None:
        """Every rank's outcome; UpdateError naming each rank that failed, if any did."""
        failures = []
        if self.group is None:
            if error is not None:
                failures.append(("this rank", error))
        else:
            import torch.distributed as dist

            outcomes = [None] * dist.get_world_size(self.group)
            mine = None if error is None else f"{type(error).__name__}: {error}"
            dist.all_gather_object(outcomes, mine, group=self.group)
            failures = [(f"rank {rank}", outcome) for rank, outcome in enumerate(outcomes) if outcome is not None]
        if failures:
            said = "; ".join(f"{who} {what}: {why}" for who, why in failures)
            held = "no version deltacast gave it" if self.version is None else f"version {self.version} of run {self.run}"
            raise UpdateError(f"{req}: {said}. The model keeps {held}", self.version, self.run) from error

    def _prepare(self, worker: Worker, req: Request, timeout: Optional[float]) -> Optional[_Plan]:
        try:
            v = worker.version(req.version, req.run or None, timeout)
        except TimeoutError as e:
            raise TimeoutError(f"{req} did not verify within {timeout} s") from e
        if self.run == v.run and self.version is not None:
            if v.number < self.version:
                raise VersionGone(f"{req} is older than version {self.version} of run {self.run}, which the model holds")
            if v.number == self.version:
                return None
        table = [(info[0], tuple(info[2]), _torch_dtype(info[1])[0]) for info in v._infos]
        if table != self._table:
            self._table = table
            self.placement = (Placement.derive(self.model, self._load_weights, table, self._probe_bytes_max) if self._derive
                              else Placement.none("placement is off"))
        if not self.placement.loadable:
            raise Error(f"{self.placement.reason}; nothing was written (a draft model given the target's checkpoint?)")
            if not self.placement.exact:
                _log.warning("deltacast: no exact placement map (%s): changed tensors go through the engine's %s",
                             self.placement.reason, "reload path" if self.reload else "loader")
        return self._plan(v)

    def _plan(self, v: Version) -> _Plan:
        held = self.version if self.run == v.run else None
        if held is None or held >= v.number or v.changes_since > held:
            return _Plan(v, whole=True, reload=self.reload is not None, loads=v.names())
        exact = self.placement.exact
        if not exact and self.reload is not None:
            return _Plan(v, whole=True, reload=True, loads=v.names())  # post-processed: the engine's reload path
        plan = _Plan(v, since=held)

        def read(name):  # on the pool: the changes of one tensor, and where they land
            if not exact:
                idx, _, changed = v._patch(name, held)
                return name, changed, None, 0
            # Only the values of this rank's part of the tensor are read.
            idx, values, changed = v._patch(name, held, keep=self.placement.held(name))
            if idx.numel() == 0:
                return name, changed, [], 0
            writes, landed = self.placement.writes(name, idx, values)
            return name, changed, writes, landed

        for name, changed, writes, landed in _pool().map(read, v.names()):
            if changed == 0:
                continue
            plan.changed += changed
            if exact:
                plan.writes += writes
                plan.in_slice += landed
                if writes:
                    plan.written.append(name)
            else:
                plan.loads.append(name)
        return plan

    def _commit(self, plan: _Plan, undo: _Undo) -> None:
        """Makes the plan's writes, recording in `undo` what it takes to put them back."""
        import torch

        with torch.no_grad():
            if plan.loads:
                undo.loads = plan.loads
                self._load(plan.version, plan.loads, plan.reload)
            # What was written is put back from the held version's values in the worker's history
            # when it has them, else from copies taken here.
            keep = not plan.writes or plan.version._native.values_since > plan.since
            if not keep:
                undo.rewrite = plan
            for owner, dst, values in plan.writes:
                flat = self.placement.params[owner].data.view(-1)
                dst = dst.to(flat.device)
                if keep:
                    undo.writes.append((flat, dst, flat.index_select(0, dst)))
                flat.index_copy_(0, dst, values.to(device=flat.device, dtype=flat.dtype))

    def _load(self, v: Version, names, reload: bool) -> None:
        # Copies, never views of the verified image: a loader may write into what it is given.
        tensors = ((name, t.to(self.device, copy=True)) for name, t in v.tensors(names))
        if not reload:
            self._load_weights(tensors)
            return
        self.reload.begin()
        try:
            self._load_weights(tensors)
        finally:
            self.reload.end()

    @staticmethod
    def _undo_writes(undo: _Undo) -> None:
        for flat, dst, old in reversed(undo.writes):
            flat.index_copy_(0, dst, old)
        undo.writes.clear()

    def _rewrite_held(self, plan: _Plan) -> None:
        """Writes the values of version plan.since where the plan wrote: back to what the model held."""
        v = plan.version
        for name in plan.written:
            idx, values, _ = v._patch(name, plan.since, values_at=plan.since, keep=self.placement.held(name))
            for owner, dst, old in self.placement.writes(name, idx, values)[0]:
                flat = self.placement.params[owner].data.view(-1)
                flat.index_copy_(0, dst.to(flat.device), old.to(device=flat.device, dtype=flat.dtype))

    def _rollback(self, worker: Worker, undo: _Undo) -> None:
        """Puts back the version held before an update this rank applied and another did not."""
        import torch

        with torch.no_grad():
            self._undo_writes(undo)
            if undo.rewrite is not None:
                self._rewrite_held(undo.rewrite)
                undo.rewrite = None
            if not undo.loads:
                return
            try:
                if self.version is None:
                    raise Error("the model held no version deltacast gave it")
                held = worker.version(self.version, self.run, timeout=0)
                self._load(held, held.names() if undo.whole else undo.loads, undo.whole and self.reload is not None)
            except Exception as e:
                _log.error("deltacast: putting back version %s failed: %s; the next update reloads every tensor", self.version, e)
                self.version = self.run = None

    def _finish(self, worker: Worker, plan: _Plan) -> None:
        v = plan.version
        before = self.version if self.run == v.run else None
        if plan.whole and self.placement.exact:
            wrong = self.placement.mismatches(v)
            if wrong:
                self.placement = Placement.none(f"after a whole load, {len(wrong)} parameters (first: {wrong[0]}) do not hold "
                                                "what the map says: the engine post-processes them")
                _log.warning("deltacast: %s; changed tensors go through the engine's %s", self.placement.reason,
                             "reload path" if self.reload else "loader")
        loaded = sum(math.prod(info[2]) for info in v._infos if info[0] in set(plan.loads)) if plan.loads else 0
        self.last_stats = {
            "version": v.number,
            "run": v.run,
            "from": before,
            "path": "reload" if plan.reload else "whole" if plan.whole else "in place" if not plan.loads else "loader",
            "values_changed": plan.changed,
            "values_changed_in_slice": plan.in_slice,
            "values_written": sum(int(dst.numel()) for _, dst, _ in plan.writes) + loaded,
            "parameters_in_place": len({owner for owner, _, _ in plan.writes}),
            "tensors_loaded": len(plan.loads),
        }
        self.version, self.run = v.number, v.run
        # Whatever the next request names, from this version on, is still there when it comes.
        worker.hold_history_from(v.run, v.number)
