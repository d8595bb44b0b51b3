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
   endpoints that need a live node also refuse (403) a key that is ejected or
   banned. The nonce is committed before the operation runs, so an operation
   that is refused cannot be replayed either.

Nothing is stored for a key the orchestrator does not know: a node key that is
not registered gets 403 at step 2 with no nonce recorded (only the trainer's and
validators' keys, named in the config, and registered nodes leave nonces). The
one call a stranger may make, registration, records its nonce in the same
transaction as the registration it makes (`record_nonce`): a registration that is
refused (no proof of work, an empty faucet) leaves no row, and a replay of one
that succeeded gets 401. A refused registration can be replayed within the
clock window; it is the signer's own request, and it can only do what the signer
asked.

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
    registering: bool = False  # registration records the nonce itself (record_nonce)
    address: str = ""  # the connection's peer (behind a proxy: the proxy)


async def authenticate(
    svc: Service, request: Request, role: str | None, live: bool, registering: bool = False
) -> Caller:
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
    address = request.client.host if request.client else ""
    return Caller(signed.key, signed.nonce, live, registering, address)


def admit(svc: Service, caller: Caller) -> None:
    """Step 2 above: record the nonce (401 if seen) and check the node's state (403 for
    a node key that is not registered; for live-node endpoints, also one that is
    ejected or banned). One statement, its own transaction, committed before the
    operation runs: the nonce stays recorded whatever the operation answers. A
    registration records its nonce in its own transaction instead (`record_nonce`)."""
    if caller.registering:
        return
    known = svc.role_of(caller.key) != "node"
    rows = svc.db.one(
        "INSERT INTO nonces SELECT ?, ?, ? WHERE ? OR EXISTS (SELECT 1 FROM nodes WHERE key = ?)"
        " ON CONFLICT (key, nonce) DO NOTHING RETURNING (SELECT state FROM nodes WHERE key = ?)",
        (caller.key, caller.nonce, svc.clock(), known, caller.key, caller.key),
    )
    if not rows:
        if not known and not svc.db.one("SELECT 1 FROM nodes WHERE key = ?", (caller.key,)):
            raise ApiError(403, "not registered: POST /v1/nodes/register first")
        raise ApiError(401, "nonce already used")
    if caller.live and not known:
        live_state_error(rows[0][0])


def record_nonce(svc: Service, cur, caller: Caller) -> None:
    """The registration's nonce, in the registration's own transaction (401 if seen)."""
    row = cur.execute(
        "INSERT INTO nonces VALUES (?, ?, ?) ON CONFLICT (key, nonce) DO NOTHING RETURNING 1",
        (caller.key, caller.nonce, svc.clock()),
    ).fetchone()
    if row is None:
        raise ApiError(401, "nonce already used")


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
