"""The orchestrator's HTTP API (FastAPI). Routes are thin: authenticate, then call
orchestrator/nodes.py or orchestrator/work.py. The API is described by the
OpenAPI document it serves at /openapi.json (checked in as docs/openapi.json).

Public (no key): /health, /metrics (Prometheus), /v1/run (the run's public
parameters), /v1/run/dataset, /v1/ledger. Signed by a node: register,
heartbeat, uploads, submit, relay reports. Signed by a validator: claim and
verdict. Signed by the trainer: /v1/trainer/*. Operator (bearer token):
/v1/admin/*. The object store routes (/objects/...) check their own
HMAC-signed URLs.

Every refusal is a 4xx with `{"detail": ...}`; request bodies above
`orchestrator.max_request_bytes` are refused with 413 before they are read.
Routes that touch the database are plain functions, which FastAPI runs on its
thread pool: a commit waiting for the disk does not stall the event loop that
reads other requests (the database lock still orders the transactions).
"""

from __future__ import annotations

import hashlib
import threading
import time
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.concurrency import run_in_threadpool

from swarmrl.orchestrator import files, nodes, work
from swarmrl.orchestrator.auth import (
    purge_nonces,
    require_live_node,
    require_operator,
    require_role,
    signer,
)
from swarmrl.orchestrator.objects import LocalObjectStore, ObjectError
from swarmrl.orchestrator.schemas import (
    ClaimIn,
    ConsumeIn,
    HeartbeatIn,
    RegisterIn,
    RelayReportIn,
    RunControlIn,
    StepIn,
    SubmitIn,
    TrainerRejectIn,
    UploadIn,
    VerdictIn,
    VersionIn,
)
from swarmrl.orchestrator.service import ApiError, Service

ERRORS = {
    401: {
        "description": "Not authenticated: bad or missing signature, stale timestamp, reused nonce"
    },
    403: {"description": "Authenticated but not allowed (role, state or grant)"},
    409: {"description": "Conflicts with the recorded state"},
    413: {"description": "Body too large"},
    422: {"description": "Body does not match the schema"},
}


class BodyLimit:
    """Refuse API bodies over `limit` bytes (413) without reading them; object
    uploads are limited by their signed size instead."""

    def __init__(self, app, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"].startswith("/objects/"):
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            return await _too_large(send, self.limit)
        seen = 0

        async def limited():
            nonlocal seen
            msg = await receive()
            seen += len(msg.get("body", b""))
            if seen > self.limit:
                raise ApiError(413, f"request body over {self.limit} bytes")
            return msg

        return await self.app(scope, limited, send)


async def _too_large(send, limit: int) -> None:
    body = b'{"detail":"request body over %d bytes"}' % limit
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(body)),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def public_params(svc: Service) -> dict:
    cfg = svc.cfg
    config = cfg.model_dump(mode="json", exclude={"orchestrator", "launcher"})
    trainer_key = cfg.shardcast.public_key or (
        sorted(svc.trainer_keys)[0] if svc.trainer_keys else ""
    )
    dataset = None
    if cfg.task.dataset:
        if svc.dataset_sha256 is None:  # hashed once, not on every public call
            svc.dataset_sha256 = hashlib.sha256(Path(cfg.task.dataset).read_bytes()).hexdigest()
        dataset = {"name": Path(cfg.task.dataset).name, "sha256": svc.dataset_sha256}
    with svc.db.tx() as cur:
        servers = work.servers(svc, cur)
    o = cfg.orchestrator
    return {
        "run_id": svc.run_id,
        "config": config,
        "trainer_key": trainer_key,
        "validator_keys": sorted(svc.validator_keys),
        "servers": servers,
        "dataset": dataset,
        "heartbeat_s": o.heartbeat_s,
        "stake": o.stake,
        "requirements": {
            "min_cpus": o.min_cpus,
            "min_memory_gb": o.min_memory_gb,
            "min_tokens_per_s": o.min_tokens_per_s,
        },
        "max_file_bytes": o.max_file_bytes,
    }


def build_app(svc: Service, sweep_every_s: float | None = None) -> FastAPI:
    """The app over `svc`. With `sweep_every_s`, a background thread applies node
    silence, finality and nonce expiry at that period while the app runs."""
    registry = CollectorRegistry()
    requests = Counter("swarmrl_requests", "API requests", ["route", "status"], registry=registry)
    latency = Histogram(
        "swarmrl_request_seconds", "API latency", ["route"], registry=registry,
        buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
    )  # fmt: skip
    node_states = Gauge("swarmrl_nodes", "Nodes by state", ["state"], registry=registry)
    file_states = Gauge("swarmrl_files", "Rollout files by state", ["state"], registry=registry)

    @asynccontextmanager
    async def lifespan(_app):
        stop = threading.Event()
        thread = None
        if sweep_every_s:

            def loop():
                while not stop.wait(sweep_every_s):
                    nodes.sweep(svc)
                    files.finalize(svc)
                    files.discard_stale(svc)
                    purge_nonces(svc)

            thread = threading.Thread(target=loop, daemon=True, name="sweeper")
            thread.start()
        yield
        stop.set()
        if thread is not None:
            thread.join(timeout=5)

    app = FastAPI(
        title="swarmrl orchestrator",
        version="1",
        description="Admits untrusted nodes by key, assigns work, keeps the ledger.",
        lifespan=lifespan,
    )

    @app.exception_handler(ApiError)
    async def api_error(_request, e: ApiError):
        return JSONResponse({"detail": e.detail}, status_code=e.status)

    @app.middleware("http")
    async def measure(request: Request, call_next):
        t0 = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        name = route.path if route is not None else "other"
        requests.labels(name, str(response.status_code)).inc()
        latency.labels(name).observe(time.perf_counter() - t0)
        return response

    def signed_by(role: str | None, live: bool = False):
        """A dependency: the caller's key, after the signature (401) and role (403)
        checks. Dependencies run before the body is validated, so an
        unauthenticated caller learns nothing about the schema."""

        async def dependency(request: Request) -> str:
            key = await signer(svc, request)
            if live:
                await run_in_threadpool(require_live_node, svc, key)
            elif role is not None:
                require_role(svc, key, role)
            return key

        return dependency

    as_node = Depends(signed_by("node"))
    as_live_node = Depends(signed_by("node", live=True))
    as_validator = Depends(signed_by("validator"))
    as_trainer = Depends(signed_by("trainer"))
    as_anyone = Depends(signed_by(None))

    async def operator(request: Request) -> None:
        require_operator(svc, request)

    as_operator = Depends(operator)

    # -- public ------------------------------------------------------------
    @app.get("/health")
    def health() -> dict:
        with svc.db.tx() as cur:
            run = work.run_state(svc, cur)
        return {"ok": True, "run_id": svc.run_id, "engine": svc.db.engine, **run}

    @app.get("/metrics")
    def metrics() -> Response:
        with svc.db.tx() as cur:
            ns = dict(cur.execute("SELECT state, COUNT(*) FROM nodes GROUP BY state").fetchall())
            fs = dict(cur.execute("SELECT state, COUNT(*) FROM files GROUP BY state").fetchall())
        for s in nodes.STATES:
            node_states.labels(s).set(ns.get(s, 0))
        for s in work.FILE_STATES:
            file_states.labels(s).set(fs.get(s, 0))
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4")

    @app.get("/v1/run")
    def run_params() -> dict:
        return public_params(svc)

    @app.get("/v1/run/dataset", responses={404: {"description": "The run has no dataset file"}})
    def dataset():
        if not svc.cfg.task.dataset:
            raise ApiError(404, "this run generates its problems; there is no dataset file")
        return FileResponse(svc.cfg.task.dataset)

    @app.get("/v1/ledger")
    def ledger() -> dict:
        return work.ledger(svc)

    # -- nodes ---------------------------------------------------------------
    @app.post("/v1/nodes/register", responses=ERRORS)
    def register(body: RegisterIn, key: str = as_node) -> dict:
        if body.role == "worker" and body.hardware is None:
            raise ApiError(422, "a worker must send its hardware report")
        if body.role == "relay" and not body.url:
            raise ApiError(422, "a relay must send its URL")
        hw = body.hardware.model_dump() if body.hardware else {}
        return nodes.register(svc, key, body.role, hw, body.url)

    @app.post("/v1/nodes/heartbeat", responses=ERRORS)
    def heartbeat(body: HeartbeatIn, key: str = as_node) -> dict:
        return work.heartbeat(svc, key, body.policy_version, body.want_work)

    @app.post("/v1/uploads", responses={**ERRORS, 429: {"description": "Rate limited"}})
    def uploads(body: UploadIn, key: str = as_live_node) -> dict:
        return work.grant_upload(svc, key, body.counter, body.size, body.sha256)

    @app.post("/v1/submit", responses=ERRORS)
    def submit(body: SubmitIn, key: str = as_live_node) -> dict:
        return work.submit(svc, key, body.key, body.sha256)

    @app.post("/v1/relays/report", responses=ERRORS)
    def relay_report(body: RelayReportIn, key: str = as_anyone) -> dict:
        if svc.role_of(key) != "validator":
            require_live_node(svc, key)
        return work.report_relay(svc, key, body.url, body.what)

    # -- validators ----------------------------------------------------------
    @app.post("/v1/validation/claim", responses=ERRORS)
    def claim(body: ClaimIn, key: str = as_validator) -> dict:
        return files.claim_file(svc, key, body.max_policy)

    @app.post("/v1/validation/verdict", responses=ERRORS)
    def verdict(body: VerdictIn, key: str = as_validator) -> dict:
        return files.record_verdict(svc, key, body.verdict.model_dump())

    # -- the trainer ---------------------------------------------------------
    @app.post("/v1/trainer/step", responses=ERRORS)
    def trainer_step(body: StepIn, key: str = as_trainer) -> dict:
        return files.open_step(svc, body.step, body.sampler.model_dump(), body.done)

    @app.post("/v1/trainer/published", responses=ERRORS)
    def trainer_published(body: VersionIn, key: str = as_trainer) -> dict:
        return files.published(svc, body.version)

    @app.get("/v1/trainer/files", responses=ERRORS)
    def trainer_files(key: str = as_trainer, step: int = Query(ge=0, le=1 << 40)) -> dict:
        return files.trainer_files(svc, step)

    @app.post("/v1/trainer/consume", responses=ERRORS)
    def trainer_consume(body: ConsumeIn, key: str = as_trainer) -> dict:
        return files.consume(svc, body.step, body.keys)

    @app.post("/v1/trainer/reject", responses=ERRORS)
    def trainer_reject(body: TrainerRejectIn, key: str = as_trainer) -> dict:
        return files.trainer_reject(svc, body.key, body.reason)

    @app.post("/v1/trainer/resume", responses=ERRORS)
    def trainer_resume(body: VersionIn, key: str = as_trainer) -> dict:
        return files.resume(svc, body.version)

    # -- the operator --------------------------------------------------------
    @app.get("/v1/admin/nodes", responses=ERRORS)
    def admin_nodes(_: None = as_operator) -> dict:
        return work.ledger(svc)

    @app.post("/v1/admin/nodes/{key}/ban", responses=ERRORS)
    def admin_ban(key: str, _: None = as_operator) -> dict:
        with svc.db.tx() as cur:
            nodes.punish(svc, cur, key, "banned", "banned by the operator", slash=False)
        return {"banned": key}

    @app.post("/v1/admin/nodes/{key}/unban", responses=ERRORS)
    def admin_unban(key: str, _: None = as_operator) -> dict:
        nodes.unban(svc, key)
        return {"unbanned": key}

    @app.post("/v1/admin/run", responses=ERRORS)
    def admin_run(body: RunControlIn, _: None = as_operator) -> dict:
        with svc.db.tx() as cur:
            if body.paused is not None:
                svc.set_meta(cur, "paused", "1" if body.paused else "0")
            if body.stopped:
                svc.set_meta(cur, "stopped", "1")
                svc.set_meta(cur, "done", "1")
            return work.run_state(svc, cur)

    # -- the object store (local) ------------------------------------------
    if isinstance(svc.objects, LocalObjectStore):
        store = svc.objects

        @app.put("/objects/{key:path}", responses=ERRORS)
        async def put_object(key: str, request: Request) -> dict:
            try:
                size, digest = store.check_upload(
                    key, dict(request.query_params), request.headers.get("content-length"),
                    svc.clock(),
                )  # fmt: skip
                await store.receive(key, size, digest, request.stream())
            except ObjectError as e:
                raise ApiError(e.status, e.detail) from None
            return {"stored": key}

        @app.get("/objects/{key:path}", responses=ERRORS)
        async def get_object(key: str, expires: str = "", sig: str = ""):
            try:
                path = store.check_download(key, expires, sig, svc.clock())
            except ObjectError as e:
                raise ApiError(e.status, e.detail) from None
            return FileResponse(path)

    app.add_middleware(BodyLimit, limit=svc.cfg.orchestrator.max_request_bytes)
    app.openapi = lambda: _with_security(app)
    return app


SIGNED_DOC = (
    "ed25519 signature (hex) by X-Swarm-Key over 'swarmrl-v1\\n' RUN_ID '\\n' METHOD '\\n' "
    "PATH?QUERY '\\n' X-Swarm-Timestamp '\\n' X-Swarm-Nonce '\\n' sha256(body) (see "
    "swarmrl/protocol/signing.py)"
)


def _with_security(app: FastAPI) -> dict:
    """The generated document plus how each route authenticates."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    from fastapi.openapi.utils import get_openapi

    doc = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    doc.setdefault("components", {})["securitySchemes"] = {
        "signed": {"type": "apiKey", "in": "header", "name": "X-Swarm-Signature", "description": SIGNED_DOC},
        "operator": {"type": "http", "scheme": "bearer", "description": "The operator's token"},
    }  # fmt: skip
    for path, ops in doc["paths"].items():
        for op in ops.values():
            if path.startswith("/v1/admin/"):
                op["security"] = [{"operator": []}]
            elif path.startswith(("/v1/nodes/", "/v1/uploads", "/v1/submit", "/v1/relays/",
                                  "/v1/validation/", "/v1/trainer/")):  # fmt: skip
                op["security"] = [{"signed": []}]
    app.openapi_schema = doc
    return doc


def openapi_spec() -> dict:
    """The API's OpenAPI document, from an app over a scratch service (docs/openapi.json)."""
    import tempfile

    from swarmrl.config import RunConfig
    from swarmrl.orchestrator.db import SQLiteDatabase

    with tempfile.TemporaryDirectory() as d:
        db = SQLiteDatabase(Path(d) / "spec.sqlite")
        svc = Service(cfg=RunConfig(), db=db, objects=LocalObjectStore(Path(d), b"x", "http://x"))
        try:
            return build_app(svc).openapi()
        finally:
            db.close()
