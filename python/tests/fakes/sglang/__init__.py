"""Stand-in for the parts of SGLang the deltacast adapter uses (tests only; see ../README.md)."""
