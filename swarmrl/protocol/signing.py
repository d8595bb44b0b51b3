"""Signed requests: every call a node, relay, validator or trainer makes to the
orchestrator carries its ed25519 key and a signature over what it asks.

Headers: `X-Swarm-Key` (public key, hex), `X-Swarm-Timestamp` (unix seconds,
an integer), `X-Swarm-Nonce` (16 to 64 characters of [A-Za-z0-9_-]) and
`X-Swarm-Signature` (hex) over

    swarmrl-v1\\n RUN_ID \\n METHOD \\n PATH?QUERY \\n TIMESTAMP \\n NONCE \\n sha256(body)

(newlines without the spaces shown). PATH?QUERY is the request target exactly
as sent (percent-encoding included), so a changed query breaks the signature;
RUN_ID ties the request to one run. The server side (orchestrator/auth.py)
checks the signature and the time window here, then records the nonce in its
database, so a request is accepted once.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from dataclasses import dataclass

from swarmrl.protocol.digits import ascii_int
from swarmrl.protocol.identity import public_key_hex, sign, verify

PREFIX = "swarmrl-v1"
NONCE = re.compile(r"^[A-Za-z0-9_-]{16,64}$")
KEY = re.compile(r"^[0-9a-f]{64}$")
HEADERS = ("X-Swarm-Key", "X-Swarm-Timestamp", "X-Swarm-Nonce", "X-Swarm-Signature")


def message(
    run_id: str, method: str, target: str, timestamp: int, nonce: str, body: bytes
) -> bytes:
    digest = hashlib.sha256(body).hexdigest()
    return "\n".join(
        [PREFIX, run_id, method.upper(), target, str(timestamp), nonce, digest]
    ).encode()


def sign_request(
    key, run_id: str, method: str, target: str, body: bytes, now: float | None = None
) -> dict[str, str]:
    """The four headers for one request; `target` is the path and query as sent."""
    ts = int(time.time() if now is None else now)
    nonce = secrets.token_urlsafe(18)
    return {
        "X-Swarm-Key": public_key_hex(key),
        "X-Swarm-Timestamp": str(ts),
        "X-Swarm-Nonce": nonce,
        "X-Swarm-Signature": sign(key, message(run_id, method, target, ts, nonce, body)),
    }


@dataclass(frozen=True)
class Signed:
    """A request whose signature checked out (its nonce is not yet recorded)."""

    key: str
    timestamp: int
    nonce: str


class SignatureError(ValueError):
    """Why a request is not authenticated (the server answers 401)."""


def check_request(
    headers, run_id: str, method: str, target: str, body: bytes, window_s: float, now: float
) -> Signed:
    """The signer of a request, or SignatureError. `headers`: a case-insensitive
    mapping. Checks the header grammar, the time window and the signature."""
    values = [headers.get(h) for h in HEADERS]
    if any(v is None for v in values):
        raise SignatureError("missing signature headers (" + ", ".join(HEADERS) + ")")
    key, ts_text, nonce, signature = values
    if not KEY.match(key):
        raise SignatureError("X-Swarm-Key is not a 64-digit lowercase hex public key")
    if not NONCE.match(nonce):
        raise SignatureError("X-Swarm-Nonce must be 16 to 64 characters of [A-Za-z0-9_-]")
    ts = ascii_int(ts_text, max_digits=12)
    if ts is None:
        raise SignatureError("X-Swarm-Timestamp is not unix seconds (1 to 12 ASCII digits)")
    if abs(now - ts) > window_s:
        raise SignatureError(f"timestamp {ts} is outside the {window_s:.0f}s window")
    if not verify(key, message(run_id, method, target, ts, nonce, body), signature):
        raise SignatureError("bad signature")
    return Signed(key, ts, nonce)
