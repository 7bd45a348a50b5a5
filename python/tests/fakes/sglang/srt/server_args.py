"""Stand-in for python/sglang/srt/server_args.py: the fields the update path reads. The
``--custom-weight-loader`` option (as the search index stores server_args.py, id 18295442; no
commit exposed) takes import paths, nargs="*", default None, which __post_init__ turns into []."""
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class ServerArgs:
    tp_size: int = 1
    custom_weight_loader: Optional[list] = None
    host: str = "127.0.0.1"
    port: int = 30000

    def __post_init__(self):
        if self.custom_weight_loader is None:
            self.custom_weight_loader = []
