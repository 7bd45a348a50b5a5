"""Stand-in for python/sglang/srt/utils/common.py at SGLang commit
004f0c7a8d398a9c4b6844c1d8071502fa88e78c, written from that file: ``MultiprocessingSerializer``
pickles with ForkingPickler (``output_str=True``: base64 text) and unpickles (base64 text first
decoded, strictly) through ``SafeUnpickler``, which loads only classes of an allowlist of module
prefixes (builtins, collections, torch, multiprocessing's fd sharing, SGLang's own, ...) and
refuses a deny list outright (RuntimeError "Blocked unsafe class loading ..."); ``dynamic_import``
turns "package.module.function" into the function. ``kill_process_tree`` stands for SGLang's
(psutil there): it kills the process's children, then, unless told otherwise, the process.
"""
import base64
import importlib
import io
import os
import pickle
import signal
from multiprocessing.reduction import ForkingPickler


class MultiprocessingSerializer:
    @staticmethod
    def serialize(obj, output_str: bool = False):
        buf = io.BytesIO()
        ForkingPickler(buf).dump(obj)
        buf.seek(0)
        output = buf.read()
        if output_str:
            output = base64.b64encode(output).decode("utf-8")
        return output

    @staticmethod
    def deserialize(data):
        if isinstance(data, str):
            data = base64.b64decode(data, validate=True)
        return SafeUnpickler(io.BytesIO(data)).load()


class SafeUnpickler(pickle.Unpickler):
    ALLOWED_MODULE_PREFIXES = {
        "builtins.", "collections.", "copyreg.", "functools.", "itertools.", "operator.", "types.", "weakref.",
        "torch.", "torch._tensor.", "torch.storage.", "torch.nn.parameter.", "torch.autograd.function.",
        "torch.distributed.", "torch.distributed._shard.", "torch.distributed._composable.", "torch._C._distributed_c10d.",
        "torch._C._distributed_fsdp.", "torch.distributed.optim.",
        "multiprocessing.resource_sharer.", "multiprocessing.reduction.", "pickletools.",
        "peft.", "transformers.", "huggingface_hub.",
        "sglang.srt.weight_sync.tensor_bucket.", "sglang.srt.model_executor.model_runner.", "sglang.srt.layers.", "sglang.srt.utils.",
    }
    DENY_CLASSES = {("builtins", "eval"), ("builtins", "exec"), ("builtins", "compile"), ("os", "system"), ("subprocess", "Popen"),
                    ("subprocess", "run"), ("codecs", "decode"), ("types", "CodeType"), ("types", "FunctionType")}

    def find_class(self, module, name):
        if (module, name) in self.DENY_CLASSES:
            raise RuntimeError(f"Blocked unsafe class loading ({module}.{name}), to prevent exploitation of CVE-2025-10164")
        if any((module + ".").startswith(prefix) for prefix in self.ALLOWED_MODULE_PREFIXES):
            return super().find_class(module, name)
        raise RuntimeError(f"Blocked unsafe class loading ({module}.{name}), to prevent exploitation of CVE-2025-10164")


def dynamic_import(func_path: str):
    parts = func_path.split(".")
    if len(parts) < 2:
        raise ValueError("func_path should contain both module name and func name (such as 'module.func')")
    module = importlib.import_module(".".join(parts[:-1]))
    return getattr(module, parts[-1])


def kill_process_tree(parent_pid: int, include_parent: bool = True) -> None:
    import multiprocessing

    for child in multiprocessing.active_children():
        child.kill()
    if include_parent:
        os.kill(parent_pid, signal.SIGKILL)
