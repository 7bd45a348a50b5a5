"""Stand-in for sglang.srt.utils.dynamic_import: "package.module.function" -> the function."""
import importlib


def dynamic_import(func_path: str):
    module_path, _, name = func_path.rpartition(".")
    return getattr(importlib.import_module(module_path), name)
