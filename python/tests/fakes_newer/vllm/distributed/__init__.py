import os

__path__.append(os.path.join(os.path.dirname(__file__), "..", "..", "..", "fakes", "vllm", "distributed"))
