"""Seed derivation shared by every process: a seed is a hash of its parts.

Assignment seeds, prompt indices, sampling seeds and warm-start batches are all
derived by hashing, so any process that knows the parts reproduces them and a
worker cannot choose them.
"""

from __future__ import annotations

import hashlib


def derive_seed(*parts: object) -> int:
    """A 63-bit seed: the first 8 bytes of sha256 over the parts joined by '/'."""
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1
