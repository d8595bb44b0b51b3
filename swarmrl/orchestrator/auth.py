"""Who is calling: signed requests (protocol/signing.py), roles, and the operator token.

The order of checks on a signed call:
1. on the event loop, before the body is read (routing.py's CheckedRoute): header grammar, time
   window and signature (any failure: 401), then the role: the trainer's and
   validators' keys come from the orchestrator's config; any other key is a
   node, and a node calling a trainer or validator endpoint gets 403. Nothing
   is written by these checks;
2. after the body is validated, on a database thread, in the same job as
   the operation (`admit`, one SQL statement): the nonce is recorded (a nonce
   seen before inside the window: 401, and the operation does not run); node
   endpoints that need a live node also refuse (403) a key that is not
   registered, or is ejected or banned. The nonce is committed before the
   operation runs, so an operation that is refused cannot be replayed either.

A replayed request carries its original, signed body, so step 2 sees the body
the first request had: a replay of a valid request gets 401, never a change.
Operator endpoints take `Authorization: Bearer <token>`, compared in constant
time.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from fastapi import Request

from swarmrl.orchestrator.service import ApiError, Service
from swarmrl.protocol.signing import SignatureError, check_request


@dataclass(frozen=True)
class Caller:
    """A request whose signature checked out; its nonce is not recorded yet."""

    key: str
    nonce: str
    live: bool  # the endpoint needs a registered node that is not ejected or banned


async def authenticate(svc: Service, request: Request, role: str | None, live: bool) -> Caller:
    """Step 1 above (no database): the caller, or ApiError 401/403. The body is
    read here; FastAPI reuses it when it validates the body afterwards."""
    body = await request.body()
    target = request.scope.get("raw_path") or request.url.path.encode()
    if request.scope.get("query_string"):
        target += b"?" + request.scope["query_string"]
    try:
        signed = check_request(
            request.headers, svc.run_id, request.method, target.decode("latin-1"), body,
            svc.cfg.orchestrator.clock_window_s, svc.clock(),
        )  # fmt: skip
    except SignatureError as e:
        raise ApiError(401, str(e)) from None
    if role is not None:
        require_role(svc, signed.key, role)
    return Caller(signed.key, signed.nonce, live)


def admit(svc: Service, caller: Caller) -> None:
    """Step 2 above: record the nonce (401 if seen) and, for live-node endpoints,
    check the node's state (403). One statement, its own transaction, committed
    before the operation runs: the nonce stays recorded whatever the operation
    answers."""
    rows = svc.db.one(
        "INSERT INTO nonces VALUES (?, ?, ?) ON CONFLICT (key, nonce) DO NOTHING"
        " RETURNING (SELECT state FROM nodes WHERE key = ?)",
        (caller.key, caller.nonce, svc.clock(), caller.key),
    )
    if not rows:
        raise ApiError(401, "nonce already used")
    if caller.live:
        live_state_error(rows[0][0])


def live_state_error(state: str | None) -> None:
    """403 unless a node in `state` (None: not registered) may upload and submit."""
    if state is None:
        raise ApiError(403, "not registered: POST /v1/nodes/register first")
    if state in ("ejected", "banned"):
        raise ApiError(403, f"this key is {state}")


def require_role(svc: Service, key: str, role: str) -> None:
    have = svc.role_of(key)
    if have != role:
        raise ApiError(403, f"this endpoint is for the {role}; the key is a {have}")


def require_live_node(svc: Service, key: str) -> None:
    require_role(svc, key, "node")
    with svc.db.tx() as cur:
        row = cur.execute("SELECT state FROM nodes WHERE key = ?", (key,)).fetchone()
    live_state_error(None if row is None else row[0])


def require_operator(svc: Service, request: Request) -> None:
    given = request.headers.get("authorization", "")
    want = f"Bearer {svc.operator_token}"
    if not svc.operator_token or not hmac.compare_digest(given.encode(), want.encode()):
        raise ApiError(401, "operator endpoints need Authorization: Bearer <operator token>")


def purge_nonces(svc: Service) -> None:
    horizon = svc.clock() - 2 * svc.cfg.orchestrator.clock_window_s
    with svc.db.tx() as cur:
        cur.execute("DELETE FROM nonces WHERE time < ?", (horizon,))
