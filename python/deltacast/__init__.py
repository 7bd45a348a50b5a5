"""deltacast for Python: a worker inside rollout processes, a publisher inside trainers.

A ``Worker`` joins a deltacast fleet (its parents: a relay, the origin, or another worker) and
exposes each version only once every chunk of it verified. A ``Version``'s tensors are zero-copy
views of its verified image, as torch tensors or numpy arrays; a view keeps the version's memory
alive after the worker is closed. ``Version.patches`` gives just what changed since an older
version, for weights that live elsewhere (a GPU).

A ``Publisher`` is the origin inside a trainer: ``publish`` a state dict every step, and
``wait_ready`` for the fleet's workers to hold it. ``encode_delta``, ``encode_anchor`` and
``decode_delta`` are for users who ship the bytes their own way.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import traceback
import warnings
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, NamedTuple, Optional, Union

import numpy as np

from ._native import Error
from . import _native


@dataclass(frozen=True)
class Request:
    """What the inference side is asked to apply: exactly ``version`` of ``run`` ("": the run the
    worker follows when the request reaches it). ``Publisher.request()`` and the adapters'
    trainer-side calls return one; ``as_dict()`` is what travels to the engine."""

    version: int
    run: str = ""

    def __post_init__(self):
        if isinstance(self.version, bool) or not isinstance(self.version, (int, np.integer)) or int(self.version) < 1:
            raise ValueError(f"versions count from 1, got {self.version!r}")
        if not isinstance(self.run, str):
            raise ValueError(f"a run is a string, got {self.run!r}")

    @classmethod
    def of(cls, value) -> "Request":
        """A Request from a Request, a dict {"version": N, "run": R} (run optional) or a number."""
        if isinstance(value, Request):
            return value
        if isinstance(value, dict):
            unknown = set(value) - {"version", "run"}
            if unknown or "version" not in value:
                raise ValueError(f"a request is {{'version': N, 'run': R}}, got keys {sorted(value)}")
            return cls(value["version"], value.get("run") or "")
        return cls(value)

    def as_dict(self) -> dict:
        return {"version": int(self.version), "run": self.run}

    def __str__(self) -> str:
        return f"version {self.version} of run {self.run}" if self.run else f"version {self.version}"


class VersionGone(Error):
    """The version asked for is not one the worker can give any more: it moved to a newer run, or
    its change history no longer reaches back to it."""


__all__ = ["Attached", "Delivery", "Error", "Publisher", "Request", "Rows", "Version", "VersionGone", "Worker", "attach", "decode_delta", "encode_anchor", "encode_delta"]

# safetensors dtype -> (numpy dtype, torch dtype name). Types torch 1.13 lacks (unsigned wider
# than 8 bits, float8) are given as the signed integer of the same width, a bit-exact view.
_DTYPES = {
    "BOOL": (np.bool_, "bool"),
    "U8": (np.uint8, "uint8"),
    "I8": (np.int8, "int8"),
    "F8_E4M3": (np.uint8, "float8_e4m3fn"),  # uint8 on a torch without float8 types
    "F8_E5M2": (np.uint8, "float8_e5m2"),
    "U16": (np.uint16, "int16"),
    "I16": (np.int16, "int16"),
    "F16": (np.float16, "float16"),
    "BF16": (np.uint16, "bfloat16"),
    "U32": (np.uint32, "int32"),
    "I32": (np.int32, "int32"),
    "F32": (np.float32, "float32"),
    "U64": (np.uint64, "int64"),
    "I64": (np.int64, "int64"),
    "F64": (np.float64, "float64"),
}


_TORCH_DTYPES: dict = {}


def _torch_dtype(dtype: str):
    """(torch dtype, element size) of a safetensors dtype."""
    found = _TORCH_DTYPES.get(dtype)
    if found is None:
        import torch

        torch_dtype = getattr(torch, _DTYPES[dtype][1], None) or torch.uint8  # float8: torch >= 2.1
        found = _TORCH_DTYPES[dtype] = (torch_dtype, torch.tensor([], dtype=torch_dtype).element_size())
    return found


def _torch_view(dtype: str, array: np.ndarray):
    """A torch tensor over the same memory as ``array``, of the safetensors dtype's torch type."""
    import torch

    torch_dtype = _torch_dtype(dtype)[0]
    if array.dtype.kind == "u" and array.dtype.itemsize > 1:
        array = array.view(np.dtype(f"int{array.dtype.itemsize * 8}"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the image is read-only; torch cannot say so
        t = torch.from_numpy(array)
    return t.view(torch_dtype) if t.dtype != torch_dtype else t


_TORCH_TO_SAFETENSORS = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64",
    "float16": "F16", "bfloat16": "BF16", "float32": "F32", "float64": "F64",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
}
_NUMPY_TO_SAFETENSORS = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "uint16": "U16", "int16": "I16", "float16": "F16", "uint32": "U32",
    "int32": "I32", "float32": "F32", "uint64": "U64", "int64": "I64", "float64": "F64",
}


def _items(named_tensors):
    return named_tensors.items() if isinstance(named_tensors, dict) else named_tensors


def _host_tensor(name: str, tensor):
    """(safetensors dtype, contiguous host array or tensor) of a torch tensor or numpy array. Contiguous
    CPU tensors are used as they are; CUDA tensors are copied into pinned host memory."""
    if isinstance(tensor, np.ndarray):
        dtype = _NUMPY_TO_SAFETENSORS.get(tensor.dtype.name)
        if dtype is None:
            raise TypeError(f"tensor {name!r}: numpy dtype {tensor.dtype} has no safetensors equivalent")
        return dtype, np.ascontiguousarray(tensor)
    import torch

    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor {name!r} is a {type(tensor).__name__}, not a torch tensor or numpy array")
    dtype = _TORCH_TO_SAFETENSORS.get(str(tensor.dtype).removeprefix("torch."))
    if dtype is None:
        raise TypeError(f"tensor {name!r}: {tensor.dtype} has no safetensors equivalent")
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        host.copy_(tensor)
        tensor = host
    return dtype, tensor.contiguous()


class Rows(NamedTuple):
    """A trainer shard's rows of a tensor: ``tensor`` is rows ``[start, start + len(tensor))`` (dim 0)
    of the tensor of that name, which has ``rows`` rows and the same other dims, as an FSDP
    ``Shard(0)`` parameter or a tensor-parallel row split holds it. A ``Publisher`` with ``shard=``
    publishes it; the origin merges the shards' rows into the whole tensor, which is what workers see."""
    tensor: object
    start: int
    rows: int


def _tensor_refs(named_tensors) -> tuple[list, list]:
    """(name, dtype, shape, data pointer, nbytes, part) per tensor, part None or (start, rows) for
    ``Rows``, and the host objects that must stay alive while the native side reads them."""
    refs, keep = [], []
    for name, tensor in _items(named_tensors):
        part = None
        if isinstance(tensor, Rows):
            part = (int(tensor.start), int(tensor.rows))
            tensor = tensor.tensor
        dtype, host = _host_tensor(name, tensor)
        if isinstance(host, np.ndarray):
            ptr, nbytes = host.ctypes.data, host.nbytes
        else:
            ptr, nbytes = host.data_ptr(), host.numel() * host.element_size()
        refs.append((str(name), dtype, [int(d) for d in host.shape], ptr, nbytes, part))
        keep.append(host)
    return refs, keep


_VIEWS_IN_CPP = None  # deltacast._torch_views, once loaded; False when this process cannot use it


def _views_in_cpp():
    """deltacast._torch_views when it was built (libtorch-dev present) against the torch this
    process runs, else False: it links that torch's libraries, and another torch must not meet them."""
    global _VIEWS_IN_CPP
    if _VIEWS_IN_CPP is None:
        _VIEWS_IN_CPP = False
        try:
            from . import _torch_build
        except ImportError:
            return False
        import torch

        here = os.path.dirname(os.path.realpath(torch.__file__))
        if (torch.__version__, here) == (_torch_build.VERSION, _torch_build.DIR):
            from . import _torch_views

            _VIEWS_IN_CPP = _torch_views
        else:
            logging.getLogger("deltacast").info(
                "tensor views made in Python: deltacast was built for torch %s at %s, this process runs %s at %s",
                _torch_build.VERSION, _torch_build.DIR, torch.__version__, here)
    return _VIEWS_IN_CPP


class Version:
    """One verified version: ``number``, ``base_number`` (0 for an anchor), ``checksum``, ``run``.

    A version the worker has moved past is read back from its change history
    (``Worker.version``): its ``tensors()`` are then copies, not views of the image."""

    def __init__(self, native: _native.Version, at: Optional[int] = None):
        self._native = native  # holds the version alive (and, read back, the history of the one at hand)
        self._at = native.number if at is None else int(at)
        self._typed = {}  # torch dtype -> the whole image as one tensor of it

    @functools.cached_property
    def _image(self) -> np.ndarray:
        return np.frombuffer(self._native, dtype=np.uint8)  # read-only

    @functools.cached_property
    def _infos(self) -> list:
        return self._native.tensor_infos()  # (name, dtype, shape, offset, nbytes, strides)

    @functools.cached_property
    def _index(self) -> dict:
        return {info[0]: i for i, info in enumerate(self._infos)}

    number = property(lambda self: self._at)
    base_number = property(lambda self: self._native.base_number if self.current else self._at - 1)
    checksum = property(lambda self: self._native.checksum if self.current else self._native.checksum_at(self._at))
    ready_us = property(lambda self: self._native.ready_us,
                        doc="When the version the worker holds became current at the worker: CLOCK_MONOTONIC microseconds, "
                            "the clock of time.monotonic_ns() // 1000 (0 for a version resumed from disk).")
    run = property(lambda self: self._native.run)
    current = property(lambda self: self._at == self._native.number,
                       doc="Whether this is the version the worker holds (its tensors are views of its image), not one "
                           "read back from the history.")

    def names(self) -> list[str]:
        return [info[0] for info in self._infos]

    def _indices(self, names: Iterable[str]) -> list[int]:
        index = self._index
        wanted = list(names)
        missing = [n for n in wanted if n not in index]
        if missing:
            raise KeyError(f"version {self.number} has no tensor {missing[0]!r}")
        return [index[n] for n in wanted]

    def _select(self, names: Optional[Iterable[str]]):
        return self._infos if names is None else [self._infos[i] for i in self._indices(names)]

    def _views(self, infos) -> Iterator[tuple[str, str, np.ndarray]]:
        for name, dtype, shape, offset, nbytes, _ in infos:
            yield name, dtype, self._image[offset : offset + nbytes].view(_DTYPES[dtype][0]).reshape(shape)

    def _image_as(self, torch_dtype, size: int):
        """The image as one torch tensor of ``torch_dtype`` (element ``size`` bytes), made once."""
        typed = self._typed.get(torch_dtype)
        if typed is None:
            import torch

            if not self._typed:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # the image is read-only; torch cannot say so
                    self._typed[torch.uint8] = torch.from_numpy(self._image)
            whole = self._typed[torch.uint8]
            typed = whole[: whole.numel() - whole.numel() % size].view(torch_dtype)
            self._typed[torch_dtype] = typed
        return typed

    def numpy_tensors(self, names: Optional[Iterable[str]] = None) -> Iterator[tuple[str, np.ndarray]]:
        """(name, read-only numpy view); BF16 as uint16. A version read back gives copies."""
        if not self.current:
            for name, dtype, shape, *_ in self._select(names):
                yield name, self._native.tensor_at(self._index[name], self._at).view(_DTYPES[dtype][0]).reshape(shape)
            return
        for name, _, array in self._views(self._select(names)):
            yield name, array

    def tensors(self, names: Optional[Iterable[str]] = None) -> Iterator[tuple[str, "torch.Tensor"]]:
        """(name, torch.Tensor) zero-copy views of the verified image; do not write to them. A version
        read back from the history gives copies."""
        if not self.current:
            return self._tensors_read_back(names)
        cpp = _views_in_cpp()
        if not cpp:
            return self._python_tensors(names)
        return iter(cpp.views(self._native.capsule(), None if names is None else self._indices(names)))

    def _tensors_read_back(self, names):
        for name, dtype, shape, *_ in self._select(names):
            raw = self._native.tensor_at(self._index[name], self._at)
            yield name, _torch_view(dtype, raw.view(_DTYPES[dtype][0]).reshape(shape))

    def _python_tensors(self, names: Optional[Iterable[str]] = None):
        """tensors() made by torch calls from Python, one per tensor."""
        for info in self._select(names):
            name, dtype, shape, offset, nbytes, strides = info
            torch_dtype, size = _torch_dtype(dtype)
            if offset % size == 0:  # one call per tensor: a view of the typed image
                yield name, self._image_as(torch_dtype, size).as_strided(shape, strides, offset // size)
            else:
                yield name, _torch_view(dtype, next(self._views([info]))[2])

    @property
    def changes_since(self) -> int:
        """The oldest version ``patches(since=...)`` reaches back to (this version's number when none)."""
        return self._native.changes_since

    def patches(self, names: Optional[Iterable[str]] = None, since: Optional[int] = None):
        """(name, flat_indices, values): what changed from version ``since`` (default: the base).

        ``param.view(-1).index_copy_(0, flat_indices, values)`` turns a tensor of version ``since``
        into this version's, bit for bit; only the changes are copied. ``flat_indices`` is
        torch.int64, ``values`` has the tensor's torch dtype. The worker keeps the changes of its
        last ``change_history`` versions: an older ``since`` (or a version that came whole, as an
        anchor) raises Error here, before anything is yielded; load ``tensors()`` then.
        """
        since = self.base_number if since is None else int(since)
        if since > self.number:
            raise ValueError(f"version {since} is newer than version {self.number}")
        reach = self._native.changes_since
        if since == 0 or since < reach:
            raise Error(f"version {self.number} keeps its changes back to version {reach} only, not to {since}: "
                        "load tensors() instead")
        return self._patches(self._select(names), since)

    def _patches(self, infos, since: int):
        for name, *_ in infos:
            yield (name, *self._patch(name, since)[:2])

    def _patch(self, name: str, since: int, values_at: Optional[int] = None, keep=None):
        """(flat_indices, values, changed) of one tensor from `since` to this version, the values
        those of version `values_at` (default: this one); with `keep` (an (n, 2) uint64 array of
        element ranges, ascending and apart) only the elements inside them, `changed` counting
        all. Releases the GIL while it works."""
        import torch

        index = self._index[name]
        idx, raw, changed = self._native.patch(index, since, self._at, values_at, keep)  # values gathered natively
        torch_dtype = _torch_dtype(self._infos[index][1])[0]
        values = torch.from_numpy(raw).view(torch_dtype) if raw.size else torch.empty(0, dtype=torch_dtype)
        return torch.from_numpy(idx), values, changed

    def verify(self, named_tensors) -> list[str]:
        """The names whose bytes differ from this version (tensors on any device; a name the
        version lacks, or a shape or size that differs, counts as different)."""
        import torch

        infos = {info[0]: info for info in self._infos}
        differ = []
        for name, tensor in (named_tensors.items() if isinstance(named_tensors, dict) else named_tensors):
            info = infos.get(name)
            if info is None or tuple(tensor.shape) != tuple(info[2]):
                differ.append(name)
                continue
            if isinstance(tensor, np.ndarray):
                raw = np.ascontiguousarray(tensor).view(np.uint8).reshape(-1)
            else:
                raw = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
            offset, nbytes = info[3], info[4]
            want = self._image[offset : offset + nbytes] if self.current else self._native.tensor_at(self._index[name], self._at)
            if raw.nbytes != nbytes or not np.array_equal(raw, want):
                differ.append(name)
        return differ


# Versions of change history a Python worker keeps unless told otherwise: enough for
# Version.patches across a few missed versions (docs/INTEGRATION.md).
DEFAULT_CHANGE_HISTORY = 4


def _settings_json(settings: Optional[dict]) -> str:
    """``settings``, any fields of a node config file (docs/RUNTIME.md, "Config files"), as JSON."""
    if settings is None:
        return ""
    if not isinstance(settings, dict):
        raise TypeError("settings: a dict of config file fields, such as {'limits': {...}, 'timing': {...}}")
    return json.dumps(settings)


def _worker_args(id, parents=None, *, keys=None, parent_keys=None, trust_keys=None, state_dir=None, in_place=False,
                 share=None, listen=None, metrics=None, change_history=DEFAULT_CHANGE_HISTORY, change_history_bytes=None, stripes=None,
                 trees=None, tree_parent_keys=None, tensors=None, settings=None) -> dict:
    """The keyword arguments of the native worker: None leaves a setting to ``settings`` or the
    node's default."""
    if isinstance(parents, str):
        parents = [parents]
    if isinstance(tensors, str):
        tensors = [tensors]
    return dict(id=id, parents=list(parents or []), keys=keys, parent_keys=list(parent_keys or []),
                trust_keys=list(trust_keys or []), state_dir=str(state_dir or ""), in_place=bool(in_place), share=str(share or ""),
                listen=listen or "",
                metrics=metrics or "", change_history=change_history, change_history_bytes=change_history_bytes, stripes=stripes,
                trees=[list(t) for t in trees or []], tree_parent_keys=[list(k) for k in tree_parent_keys or []],
                tensors=list(tensors or []), settings=_settings_json(settings))


class _Reader:
    """The reading API a Worker and an Attached reader share."""

    def _setup(self, native) -> None:
        self._native = native
        self._callbacks: list[Callable[[Version], None]] = []
        self._thread: Optional[threading.Thread] = None
        self._closing = threading.Event()

    def wait(self, min_version: Optional[int] = None, timeout: Optional[float] = None) -> Version:
        """The current version once it is >= min_version (default: any); TimeoutError otherwise."""
        return Version(self._native.wait(min_version or 1, -1.0 if timeout is None else float(timeout)))

    def current(self) -> Optional[Version]:
        v = self._native.current()
        return Version(v) if v is not None else None

    def version(self, number: int, run: Optional[str] = None, timeout: Optional[float] = None) -> Version:
        """Exactly version ``number`` of ``run`` (default: the run the worker follows now), waiting
        up to ``timeout`` seconds for it to verify. A version the worker has moved past is read back
        from its change history (``hold_history_from`` keeps it there).

        Raises TimeoutError when it did not verify in time, and VersionGone when the worker cannot
        give it: it moved to a newer run, or its history no longer reaches back to it."""
        number = int(number)
        if number < 1:
            raise ValueError(f"versions count from 1, got {number}")
        v = self._native.wait_for(run or "", number, -1.0 if timeout is None else float(timeout))
        if v is None:
            raise TimeoutError(f"version {number} of run {run or '(the current one)'} did not verify within {timeout} s")
        if run and v.run != run:
            raise VersionGone(f"version {number} of run {run} is gone: the worker moved to run {v.run} (version {v.number})")
        if number != v.number and number < v.values_since:
            raise VersionGone(f"version {number} of run {v.run} is gone: the worker holds version {v.number} and keeps versions "
                              f"back to {v.values_since} only (change_history, or hold_history_from the version a model holds)")
        return Version(v, number)

    def report_model(self, run: Optional[str], version: Optional[int], *, error: Optional[str] = None,
                     failed: Optional[Request] = None) -> None:
        """Tells the fleet ledger what the model this worker feeds holds: ``version`` of ``run``
        (None: none deltacast gave it) and, with ``failed``, the request its last update could not
        apply, with ``error``. ``Publisher.wait_ready`` then counts the model, not the worker, and
        names it when it failed."""
        failed_run = failed.run if failed else ""
        if failed and not failed_run:
            current = self._native.current()
            failed_run = current.run if current is not None else ""
        self._native.report_model(run or "", int(version or 0), failed_run, int(failed.version) if failed else 0, error or "")

    def hold_history_from(self, run: str, number: int) -> None:
        """Keeps every version from ``number`` of ``run`` on readable (``version()``), past
        ``change_history`` and within ``change_history_bytes``, until called again (0 lets go)."""
        self._native.hold_history_from(run, int(number))

    def set_tensors(self, tensors: Optional[Iterable[str]]) -> None:
        """Serves these tensors from now on (glob patterns as ``Worker(tensors=...)``; None: every
        tensor), as an engine rank whose experts or pipeline stage change does. The parent hears
        of it at once. Narrowed, the next version lists fewer tensors; grown, the chunks of the new
        tensors come as a catch-up (those chunks of the newest anchor and the deltas after it,
        not an anchor of every tensor), and the next version lists the new tensors: until it
        comes, ``current()`` keeps the old ones. Its ``base_number`` is 0, as an anchor's. Raises
        ValueError for patterns out of bounds, and for an attached reader (set them on the host's
        worker)."""
        self._native.set_tensors([str(t) for t in (tensors or [])])

    def on_version(self, callback: Callable[[Version], None]) -> None:
        """Calls ``callback(version)`` on a Python thread for each version that becomes current.
        An exception in a callback is logged (logger "deltacast") and the others still run. With
        ``in_place=True`` the next version is applied only once nobody holds the current one: let
        go of the Version and its views when the callback is done with them."""
        self._callbacks.append(callback)
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="deltacast-on-version", daemon=True)
            self._thread.start()

    def _watch(self) -> None:
        last = None
        while not self._closing.is_set():
            try:
                v = self._native.wait_newer(last, 0.2)
            except Error:
                return  # closed
            if v is None:
                continue
            last = v.stub()  # holds no image: an in-place worker may apply the next version
            version = Version(v)
            del v
            for cb in list(self._callbacks):
                try:
                    cb(version)
                except Exception as e:  # one failing callback must not stop the others, or later versions
                    # The traceback's frames hold the version; a log handler may keep the record.
                    traceback.clear_frames(e.__traceback__)
                    logging.getLogger("deltacast").exception("on_version callback failed for version %d", version.number)
            del version

    def close(self) -> None:
        """Stops the worker; with a ``state_dir``, the version it holds is saved first if it was not."""
        self._closing.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._native.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Worker(_Reader):
    """A rollout process's worker: joins ``parents`` (endpoints, most preferred first).

    In a multi-tree fleet (``deltacast fleet-init --trees N``) give ``trees`` instead: each
    tree's parents, most preferred first, as the config file's ``"trees"``; with CURVE,
    ``tree_parent_keys`` in the same shape (the config's ``"tree_parent_keys"``).

    ``share``: a Unix socket path; the worker shares each verified version with the host's other
    processes, which ``attach`` to it and read its images with no copy (docs/RUNTIME.md, "One
    image per host"). Not with ``in_place``.

    ``tensors``: glob patterns (``*`` matches dots too) of the tensors this worker serves, for an
    engine rank that holds some experts or one pipeline stage: it receives, verifies, holds and
    saves only the chunks that cover them, its parent sends only those, and its versions list only
    those tensors (docs/RUNTIME.md, "Hosts that hold only what they serve"). None: every tensor.

    ``change_history``: how many versions back ``Version.patches`` and ``version()`` can reach
    (each kept costs 4 bytes per changed value, and the value's own size; 0 keeps none);
    ``change_history_bytes``: at most this many bytes of it, also when ``hold_history_from`` asks
    for more (0: as many as the image). ``stripes``: TCP connections per parent link at
    most (1 to 64; default 64): a link starts with one and its parent asks for more while they
    add throughput, for a parent across a long link that one connection's window cannot fill
    (docs/RUNTIME.md, "Links that size themselves"). ``settings``: any other field of a node config file, as a
    dict (``{"limits": {...}, "timing": {...}, "cache_size": "8GB", "scrub_rate": "64MB"}``;
    docs/RUNTIME.md, "Config files"), under the named arguments; checked as the config file's.
    """

    def __init__(self, id: str, parents: Optional[list[str]] = None, *, keys=None, parent_keys=None, trust_keys=None,
                 state_dir=None, in_place=False, share=None, listen=None, metrics=None, change_history=DEFAULT_CHANGE_HISTORY,
                 change_history_bytes=None, stripes=None, trees=None, tree_parent_keys=None, tensors=None,
                 settings: Optional[dict] = None):
        self._setup(_native.Worker(**_worker_args(id, parents, keys=keys, parent_keys=parent_keys, trust_keys=trust_keys,
                                                  state_dir=state_dir, in_place=in_place, share=share, listen=listen, metrics=metrics,
                                                  change_history=change_history, change_history_bytes=change_history_bytes,
                                                  stripes=stripes, trees=trees, tree_parent_keys=tree_parent_keys, tensors=tensors,
                                                  settings=settings)))

    @classmethod
    def from_config(cls, path, *, state_dir=None, change_history=DEFAULT_CHANGE_HISTORY, change_history_bytes=None,
                    settings: Optional[dict] = None) -> "Worker":
        """A worker from a node config file, as ``deltacast worker --config`` reads it
        (docs/RUNTIME.md, "Config files"): the files ``deltacast fleet-init`` writes, with their
        parents or trees, key files, trust keys, limits, timing and ``in_place``, ``listen``,
        ``metrics``, ``stripes`` and ``scrub_rate``; ``settings`` over them. A config that does not
        check raises deltacast.Error."""
        worker = cls.__new__(cls)
        worker._setup(_native.Worker(config_path=str(path), state_dir=str(state_dir or ""), change_history=change_history,
                                     change_history_bytes=change_history_bytes, settings=_settings_json(settings)))
        return worker

    @staticmethod
    def settings(id: str = "", parents: Optional[list[str]] = None, *, config_path=None, **kwargs) -> dict:
        """The node settings a ``Worker`` with these arguments runs with, as a config file holds
        them, checked as starting the worker checks them (deltacast.Error if they do not check)."""
        args = _worker_args(id, parents, **kwargs)
        if config_path:
            args["config_path"] = str(config_path)
        return json.loads(_native.Worker.settings(**args))

    @property
    def listening(self) -> str:
        return self._native.listening()


class Attached(_Reader):
    """A reader of the versions a worker on this host shares (``Worker(share=PATH)``,
    ``deltacast worker --share PATH``): ``attach(PATH)`` makes one. It has the Worker's reading
    API; its versions are the worker's images, mapped read-only, so that the ranks of an engine
    on one host hold and download each version once. A version it gives stays unchanged until
    it is let go of. ``report_model`` and ``hold_history_from`` go to the worker, which reports
    its readers' models as one and keeps history back to the oldest any reader asks for. When
    the worker goes away, the versions held stay readable and the reader attaches again, every
    0.1 to 2 s, until a worker serves the path again (a restarted one); ``disconnected`` says
    why it is not attached meanwhile."""

    def __init__(self, path, timeout: Optional[float] = 30.0):
        self._setup(_native.Worker.attach(str(path), -1.0 if timeout is None else float(timeout)))

    @property
    def disconnected(self) -> Optional[str]:
        """Why the reader is not attached now; None while it is."""
        return self._native.disconnected() or None


def attach(path, timeout: Optional[float] = 30.0) -> Attached:
    """Attaches to the worker sharing ``path`` on this host, waiting up to ``timeout`` seconds
    for it to start listening (None: no limit)."""
    return Attached(path, timeout)


class Delivery(NamedTuple):
    """How far a version got: workers holding it (or newer), workers waited for, and its publish to
    ready time among those that reported this very version."""

    workers_ready: int
    workers_wanted: int
    median_ms: int
    max_ms: int


def _signing_key(sign_key: Optional[str]) -> str:
    """The Ed25519 secret key as hex, from hex text or a key file of ``deltacast keygen --sign``."""
    if not sign_key:
        return ""
    if os.path.exists(sign_key):
        with open(sign_key) as f:
            return json.load(f)["secret_key"]
    return sign_key


def _publisher_args(listen, *, origin=None, shard=None, expect_shards=None, keys=None, allow_keys=None, sign_key=None, anchor_every=None, codec=None,
                    wan_rate=None, worker_cores=None, v2=False, chunk_bytes=None, threads=0, metrics=None, id=None, run_state=None,
                    settings=None) -> dict:
    """The keyword arguments of the native publisher: None leaves a setting to its default."""
    if v2 and codec not in (None, "v1", "v2"):
        raise ValueError("v2=True and codec=%r say different things" % (codec,))
    if shard is not None and (not isinstance(shard, (tuple, list)) or len(shard) != 2 or not all(isinstance(x, int) for x in shard)):
        raise ValueError("shard=(i, n): slice i of n trainer shards, not %r" % (shard,))
    if not run_state and sign_key and os.path.exists(sign_key):
        run_state = sign_key + ".run"
    return dict(id=id or "", listen=listen or "", origin=origin or "", shard="%d/%d" % tuple(shard) if shard is not None else "",
                expect_shards=expect_shards, keys=keys, allow_keys=list(allow_keys or []), sign_key=_signing_key(sign_key),
                anchor_every=anchor_every, codec="v2" if v2 else (codec or ""), wan_rate=wan_rate or "",
                worker_cores=float(worker_cores or 0), chunk_bytes=chunk_bytes, threads=int(threads), metrics=metrics or "",
                run_state=run_state or "", settings=_settings_json(settings))


class Publisher:
    """The origin inside a trainer: relays and workers connect to ``listen``.

    ``keys``: the publisher's CURVE pair (public, secret), Z85; ``allow_keys``: the CURVE public keys
    of the relays and workers it accepts (empty: any that knows its key). ``sign_key``: an Ed25519
    secret key (hex, or a ``deltacast keygen --sign`` file) that signs every version, for workers that
    trust only it. The first version, and any whose tensors differ in names, dtypes or shapes from
    the one before, goes out whole (an anchor); the others as deltas, with an anchor after every
    ``anchor_every`` versions. ``codec``: the deltas' codec, as ``deltacast publish --codec``: "v1";
    "v2", codec v2 where it is smaller per chunk (about 30% fewer bytes, several times the workers'
    CPU); "v3" (about 18% fewer bytes than v1, about twice the workers' CPU); "auto", per version
    whichever the workers hold sooner (v1, v3 or v2), given ``wan_rate`` (the slowest WAN
    link a version crosses, e.g. "10Gbit") and ``worker_cores``. ``v2=True`` is ``codec="v2"``.
    ``run_state``: the file where the start of each run signed by ``sign_key`` is kept, so that a run
    always starts after the last one whatever this host's clock says (default: next to the key file,
    ``<key file>.run``, or for a key given as hex ``$XDG_STATE_HOME/deltacast/<public key>.run``).
    ``settings``: any field of a node config file, as a dict (``{"limits": {...}, "timing": {...}}``;
    docs/RUNTIME.md, "Config files"), under the named arguments.

    ``expect_shards=n``: the origin of n trainer shards, which merges the slices they send into versions
    and publishes nothing itself (as ``deltacast publish --expect-shards n``); ``newest_version`` and
    ``wait_ready`` follow the merged versions.

    A trainer shard instead: ``shard=(i, n)`` and ``origin`` (the endpoint of an origin with
    ``expect_shards=n``), no ``listen``. It publishes only what its process holds:
    whole tensors, and ``Rows(tensor, start, rows)`` for a range of rows of a tensor; the origin
    merges the n shards' slices into versions of whole tensors (docs/RUNTIME.md, "Trainer shards").
    Every shard publishes the same tensor names in the same order each version.
    """

    def __init__(self, listen: str = "", *, origin: Optional[str] = None, shard: Optional[tuple] = None,
                 expect_shards: Optional[int] = None, keys=None, allow_keys=None, sign_key=None, anchor_every: Optional[int] = None,
                 codec: Optional[str] = None, wan_rate: Optional[str] = None, worker_cores: Optional[float] = None, v2: bool = False,
                 chunk_bytes: Optional[int] = None, threads: int = 0, metrics: Optional[str] = None, id: Optional[str] = None,
                 run_state: Optional[str] = None, settings: Optional[dict] = None):
        self._native = _native.Publisher(**_publisher_args(listen, origin=origin, shard=shard, expect_shards=expect_shards, keys=keys, allow_keys=allow_keys,
                                                           sign_key=sign_key,
                                                           anchor_every=anchor_every, codec=codec, wan_rate=wan_rate,
                                                           worker_cores=worker_cores, v2=v2, chunk_bytes=chunk_bytes, threads=threads,
                                                           metrics=metrics, id=id, run_state=run_state, settings=settings))

    @staticmethod
    def settings(listen: str = "", **kwargs) -> dict:
        """The node settings a ``Publisher`` with these arguments runs with, as a config file holds
        them, checked as starting the publisher checks them (deltacast.Error if they do not)."""
        return json.loads(_native.Publisher.settings(**_publisher_args(listen, **kwargs)))

    def publish(self, named_tensors, version: Optional[int] = None) -> int:
        """Publishes ``{name: tensor}`` (or (name, tensor) pairs, in image order) as version ``version``
        (default: the one after the last; a number at or below the last is refused, one past the
        next goes out as an anchor) and returns its number. Trainer shards give the same number for the same step, such as the training step: a
        shard process that restarts resumes at its step, whatever its own count. The tensors are copied once, into the image the next delta is made from:
        the trainer may change them as soon as this returns."""
        refs, keep = _tensor_refs(named_tensors)
        version = self._native.publish(refs, 0 if version is None else int(version))
        del keep
        return version

    def wait_ready(self, version: int, min_workers: Optional[int] = None, timeout: Optional[float] = None) -> Delivery:
        """Waits until ``min_workers`` workers (default: every worker the fleet ledger knows that has
        not left) hold ``version`` or newer; TimeoutError after ``timeout`` seconds."""
        return Delivery(*self._native.wait_ready(int(version), int(min_workers or 0), -1.0 if timeout is None else float(timeout)))

    def ledger(self) -> dict:
        """The fleet ledger: per worker id, its newest version, run, checksum, publish to ready time,
        last error and whether it left."""
        return self._native.ledger()

    def request(self, version: Optional[int] = None) -> Request:
        """What asks the inference side for exactly ``version`` (default: the newest published) of
        this publisher's run: pass ``.as_dict()`` as an engine's update info."""
        return Request(int(self.version if version is None else version), self.run)

    version = property(lambda self: self._native.version(),
                       doc="The newest version published (0 before any); at an origin of trainer shards, the newest merged.")
    last_codec = property(lambda self: self._native.last_codec(),
                          doc="How the newest version went out as a delta: the codec chosen and what v1, v3 and v2 would "
                              "cost (WAN and worker seconds, zero for one not tried); None for an anchor.")
    run = property(lambda self: self._native.run())
    listening = property(lambda self: self._native.listening())

    def close(self) -> None:
        self._native.close()

    def __enter__(self) -> "Publisher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def encode_anchor(tensors, *, version: int = 1, chunk_bytes: int = 4 << 20) -> bytes:
    """A whole version of ``{name: tensor}`` as a deltacast container (docs/FORMAT.md)."""
    refs, keep = _tensor_refs(tensors)
    return _native.encode(None, refs, int(version), 0, False, int(chunk_bytes))


def encode_delta(base, new, *, version: Optional[int] = None, base_version: int = 1, v2: bool = False,
                 chunk_bytes: int = 4 << 20) -> bytes:
    """A delta turning ``base`` into ``new`` (same names, dtypes, shapes and order) as a container;
    ``version`` defaults to base_version + 1."""
    base_refs, keep_base = _tensor_refs(base)
    new_refs, keep_new = _tensor_refs(new)
    version = base_version + 1 if version is None else version
    return _native.encode(base_refs, new_refs, int(version), int(base_version), bool(v2), int(chunk_bytes))


def decode_delta(base, delta: Union[bytes, bytearray, memoryview]) -> dict:
    """``{name: torch.Tensor}`` of the version in ``delta`` (a container), every chunk and the version
    checksum verified; ``base`` holds the tensors the delta was made from (None for an anchor).
    Raises Error when anything fails to verify, base included."""
    refs, keep = _tensor_refs(base) if base is not None else (None, None)
    return dict(Version(_native.decode(refs, delta)).tensors())
