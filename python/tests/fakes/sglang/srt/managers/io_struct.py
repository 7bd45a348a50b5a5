"""Stand-in for python/sglang/srt/managers/io_struct.py at SGLang commit
001067fffe33427bee0ed2f007fb7551a1d76b44: the request for updating weights from serialized
tensors (one entry per tensor-parallel rank: raw MultiprocessingSerializer bytes; an HTTP client
sends base64 text, which the HTTP layer decodes, Base64Bytes there) and its output. A dataclass
here (a msgspec struct there)."""
from dataclasses import dataclass
from typing import List, Optional


@dataclass(kw_only=True)
class UpdateWeightsFromTensorReqInput:
    serialized_named_tensors: List[bytes]
    load_format: Optional[str] = None
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: Optional[str] = None
    disable_draft_model: Optional[bool] = None
    torch_empty_cache: bool = False


@dataclass(kw_only=True)
class UpdateWeightsFromTensorReqOutput:
    success: bool
    message: str
