"""vLLM's newer trainer API (python/tests/fakes_newer): the modules that differ from the stand-ins
of python/tests/fakes, which provide the rest."""
import os

__path__.append(os.path.join(os.path.dirname(__file__), "..", "..", "fakes", "vllm"))
