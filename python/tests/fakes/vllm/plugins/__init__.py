"""Stand-in for vllm/plugins/__init__.py: every process calls the functions that installed
packages register under the `vllm.general_plugins` entry-point group."""
from importlib.metadata import entry_points


def load_general_plugins() -> list[str]:
    loaded = []
    for ep in entry_points(group="vllm.general_plugins"):
        ep.load()()
        loaded.append(ep.name)
    return loaded
