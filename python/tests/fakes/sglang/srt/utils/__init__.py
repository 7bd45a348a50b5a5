"""Stand-in for sglang.srt.utils (the package re-exports utils/common.py)."""
from sglang.srt.utils.common import MultiprocessingSerializer, SafeUnpickler, dynamic_import, kill_process_tree

__all__ = ["MultiprocessingSerializer", "SafeUnpickler", "dynamic_import", "kill_process_tree"]
