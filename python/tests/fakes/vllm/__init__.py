"""Stand-in for the parts of vLLM the deltacast adapter uses (tests only; see ../README.md)."""
