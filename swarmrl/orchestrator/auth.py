"""Who is calling: signed requests (protocol/signing.py), roles, and the operator token.

The order of checks on a signed call: header grammar, time window and
signature (any failure: 401 and nothing is written), then the nonce is
recorded (a nonce seen before inside the window: 401), then the role: the
trainer's and validators' keys come from the orchestrator's config; any
other key is a node, and a node calling a trainer or validator endpoint gets
403. Node endpoints also refuse (403) a key that is not registered, or is
ejected or banned. Operator endpoints take `Authorization: Bearer <token>`,
compared in constant time.
"""

from __future__ import annotations

import hmac

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from swarmrl.orchestrator.service import ApiError, Service
from swarmrl.protocol.signing import SignatureError, check_request


async def signer(svc: Service, request: Request) -> str:
    """The key that signed this request (the body is read here, on the event loop;
    the check and the nonce's insert run on a worker thread)."""
    body = await request.body()
    target = request.scope.get("raw_path") or request.url.path.encode()
    if request.scope.get("query_string"):
        target += b"?" + request.scope["query_string"]
    return await run_in_threadpool(
        check_and_record, svc, request.headers, request.method, target.decode("latin-1"), body
    )


def check_and_record(svc: Service, headers, method: str, target: str, body: bytes) -> str:
    now = svc.clock()
    window = svc.cfg.orchestrator.clock_window_s
    try:
        signed = check_request(headers, svc.run_id, method, target, body, window, now)
    except SignatureError as e:
        raise ApiError(401, str(e)) from None
    with svc.db.tx() as cur:
        fresh = cur.execute(
            "INSERT INTO nonces VALUES (?, ?, ?) ON CONFLICT (key, nonce) DO NOTHING",
            (signed.key, signed.nonce, now),
        ).rowcount
    if fresh != 1:
        raise ApiError(401, "nonce already used")
    return signed.key


def require_role(svc: Service, key: str, role: str) -> None:
    have = svc.role_of(key)
    if have != role:
        raise ApiError(403, f"this endpoint is for the {role}; the key is a {have}")


def require_live_node(svc: Service, key: str) -> None:
    require_role(svc, key, "node")
    with svc.db.tx() as cur:
        row = cur.execute("SELECT state FROM nodes WHERE key = ?", (key,)).fetchone()
    if row is None:
        raise ApiError(403, "not registered: POST /v1/nodes/register first")
    if row[0] in ("ejected", "banned"):
        raise ApiError(403, f"this key is {row[0]}")


def require_operator(svc: Service, request: Request) -> None:
    given = request.headers.get("authorization", "")
    want = f"Bearer {svc.operator_token}"
    if not svc.operator_token or not hmac.compare_digest(given.encode(), want.encode()):
        raise ApiError(401, "operator endpoints need Authorization: Bearer <operator token>")


def purge_nonces(svc: Service) -> None:
    horizon = svc.clock() - 2 * svc.cfg.orchestrator.clock_window_s
    with svc.db.tx() as cur:
        cur.execute("DELETE FROM nonces WHERE time < ?", (horizon,))
