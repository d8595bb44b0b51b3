"""The proof of work a new key pays to register (orchestrator.register_work_bits).

The proof is a decimal nonce such that SHA-256 of

    b"swarmrl-register\\0" + run_id + b"\\0" + public key (hex) + b"\\0" + nonce

starts with `bits` zero bits. It names the run and the key, so it is paid once
per key and run and cannot be reused by another key or carried to another
run; checking it is one hash. Solving takes 2^bits hashes on average; the
orchestrator sets `bits` from a price in seconds of one core
(`orchestrator.register_work_s`), measuring how fast one core of its own
machine runs this loop (`hashes_per_second`, `bits_for`). Hardware built for
hashing does it far faster, so this prices keys for a script on a laptop, not
for a farm (docs/threat-model.md). The orchestrator's faucet is the bound that
holds whatever the attacker's hardware.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import time

MAX_BITS = 40
MAX_NONCE_DIGITS = 20


def _prefix(run_id: str, public_key: str) -> hashlib._Hash:
    h = hashlib.sha256(b"swarmrl-register\0")
    h.update(run_id.encode() + b"\0" + public_key.encode() + b"\0")
    return h


def _zero_bits(digest: bytes) -> int:
    value = int.from_bytes(digest, "big")
    return len(digest) * 8 - value.bit_length()


def solve(run_id: str, public_key: str, bits: int) -> str:
    """The first nonce (counting from 0) whose hash starts with `bits` zero bits."""
    if not 0 <= bits <= MAX_BITS:
        raise ValueError(f"proof of work of {bits} bits: at most {MAX_BITS}")
    prefix = _prefix(run_id, public_key)
    for n in itertools.count():
        nonce = str(n).encode()
        h = prefix.copy()
        h.update(nonce)
        if _zero_bits(h.digest()) >= bits:
            return nonce.decode()
    raise AssertionError("unreachable")


def check(run_id: str, public_key: str, nonce: str, bits: int) -> bool:
    """Whether `nonce` proves `bits` bits of work for this key and run (ASCII digits
    only, at most MAX_NONCE_DIGITS of them)."""
    if bits <= 0:
        return True
    if not (0 < len(nonce) <= MAX_NONCE_DIGITS and nonce.isascii() and nonce.isdigit()):
        return False
    h = _prefix(run_id, public_key)
    h.update(nonce.encode())
    return _zero_bits(h.digest()) >= bits


def hashes_per_second(hashes: int = 1 << 16) -> float:
    """How many candidate nonces one core checks a second here, timed on `hashes` of
    them (CPU time of this thread: other load on the machine does not count)."""
    prefix = _prefix("calibration", "0" * 64)
    start = time.thread_time()
    for n in range(hashes):
        h = prefix.copy()
        h.update(str(n).encode())
        _zero_bits(h.digest())
    return hashes / max(time.thread_time() - start, 1e-9)


def bits_for(seconds: float, rate: float) -> int:
    """The proof whose average cost is nearest `seconds` at `rate` hashes a second
    (0 for no proof; at most MAX_BITS)."""
    if seconds <= 0:
        return 0
    return max(1, min(MAX_BITS, round(math.log2(seconds * rate))))
