"""The orchestrator's HTTP API (FastAPI). Routes are thin: authenticate, then call
orchestrator/nodes.py or orchestrator/work.py. The API is described by the
OpenAPI document it serves at /openapi.json (checked in as docs/openapi.json).

Public (no key): /health, /metrics (Prometheus), /v1/run (the run's public
parameters), /v1/run/servers, /v1/run/dataset, /v1/ledger. Signed by a node: register,
heartbeat, uploads, submit, relay reports. Signed by a validator: claim and
verdict. Signed by the trainer: /v1/trainer/*. Operator (bearer token):
/v1/admin/*. The object store routes (/objects/...) check their own
HMAC-signed URLs.

Every refusal is a 4xx with `{"detail": ...}`; request bodies above
`orchestrator.max_request_bytes` are refused with 413 before they are read.
Signed routes check the signature and role on the event loop (auth.py), then
run the nonce's record and the operation as one job on a small thread pool of
their own (`call`): a commit waiting for the disk does not stall the event loop
that reads other requests (the database lock still orders the transactions),
and a request crosses threads once. The request metrics are a plain ASGI
middleware (orchestrator/asgi.py). (Both measured: Starlette's `@app.middleware` wrapper and two
hops through AnyIO's thread pool per request were most of the orchestrator's
CPU under load; bench/orchestrator_load.py.)
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import FileResponse, Response

from swarmrl.envs.python_tool import interpreter_version
from swarmrl.orchestrator import (
    admission,
    dashboard,
    files,
    mismatch,
    nodes,
    relays,
    relaystanding,
    work,
)
from swarmrl.orchestrator.apidoc import ERRORS, with_security
from swarmrl.orchestrator.asgi import BodyLimit, Measure, Metrics
from swarmrl.orchestrator.auth import (
    Caller,
    admit,
    authenticate,
    purge_nonces,
    require_live_node,
    require_operator,
)
from swarmrl.orchestrator.objects import LocalObjectStore, ObjectError
from swarmrl.orchestrator.relaycheck import RelayChecker
from swarmrl.orchestrator.routing import CheckedRoute, add_refusals
from swarmrl.orchestrator.schemas import (
    ClaimIn,
    ConsumeIn,
    EvaluationIn,
    HeartbeatIn,
    InvitesIn,
    MetricsIn,
    MismatchIn,
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

log = logging.getLogger("swarmrl.orchestrator")


def public_params(svc: Service) -> dict:
    cfg = svc.cfg
    config = cfg.model_dump(mode="json", exclude={"orchestrator", "launcher"})
    if cfg.env.kind != "none" and "python" in cfg.env.tools and not cfg.env.python_version:
        config["env"]["python_version"] = interpreter_version()  # every node runs this one
    if cfg.task.name == "verifiers" and not cfg.task.env_fingerprint and svc.taskset_pin:
        config["task"]["env_fingerprint"] = svc.taskset_pin  # every node runs this taskset
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
        "trainer_key": svc.manifest_key(),
        "validator_keys": sorted(svc.validator_keys),
        "servers": servers,
        "dataset": dataset,
        "heartbeat_s": o.heartbeat_s,
        "stake": o.stake,
        "register_work_bits": svc.work_bits,
        "invitation_only": o.faucet_burst == 0,
        "requirements": {
            "min_cpus": o.min_cpus,
            "min_memory_gb": o.min_memory_gb,
            "min_tokens_per_s": o.min_tokens_per_s,
        },
        "max_file_bytes": o.max_file_bytes,
    }


class Signed:
    """What the signed routes share: one FastAPI dependency per role, which
    yields the caller after the signature (401) and role (403) checks, and
    `call`, which runs an operation on the database threads.

    CheckedRoute runs the check before the body is read, so an unauthenticated
    caller learns nothing about the schema."""

    def __init__(self, svc: Service, pool: ThreadPoolExecutor) -> None:
        self.svc = svc
        self.pool = pool
        self.node = Depends(self._signed_by("node"))
        self.newcomer = Depends(self._signed_by("node", registering=True))
        self.live_node = Depends(self._signed_by("node", live=True))
        self.validator = Depends(self._signed_by("validator"))
        self.trainer = Depends(self._signed_by("trainer"))
        self.anyone = Depends(self._signed_by(None))

    def _signed_by(self, role: str | None, live: bool = False, registering: bool = False):
        async def check(request: Request) -> Caller:
            return await authenticate(self.svc, request, role, live, registering)

        async def dependency(request: Request) -> Caller:
            caller = getattr(request.state, "caller", None)
            return caller if caller is not None else await check(request)

        dependency.authenticate = check  # CheckedRoute runs it before reading the body
        return dependency

    async def call(self, caller: Caller, fn, *args):
        """`fn(*args)` on the database threads, after `admit` (the nonce, and the
        node's state where the route needs a live node) in the same job."""

        def job():
            admit(self.svc, caller)
            return fn(*args)

        return await asyncio.get_running_loop().run_in_executor(self.pool, job)


def _sweep_forever(svc: Service, every_s: float, stop: threading.Event) -> None:
    """Every `every_s` until `stop`: silence, finality, nonces, relay checks, checkpoint."""
    checker = RelayChecker(svc)  # relaycheck.py: the checks run on a thread of their own
    while not stop.wait(every_s):
        try:
            nodes.sweep(svc)
            files.finalize(svc)
            files.discard_stale(svc)
            purge_nonces(svc)
            checker.start_due()
            svc.db.checkpoint()  # db.py: the journal's copy-back, off the request path
        except Exception:  # a failed sweep (a deadlock, a lost connection) is retried
            log.exception("sweep failed; retrying in %.1f s", every_s)
    checker.close()


def _lifespan(svc: Service, pool: ThreadPoolExecutor, sweep_every_s: float | None):
    """The app's lifespan: the sweeper thread while it runs (with `sweep_every_s`),
    and the database threads shut down after it."""

    @asynccontextmanager
    async def lifespan(_app):
        stop = threading.Event()
        thread = None
        if sweep_every_s:
            thread = threading.Thread(
                target=_sweep_forever, args=(svc, sweep_every_s, stop), daemon=True, name="sweeper"
            )
            thread.start()
        yield
        stop.set()
        if thread is not None:
            thread.join(timeout=5)
        pool.shutdown(wait=False)

    return lifespan


def build_app(svc: Service, sweep_every_s: float | None = None) -> FastAPI:
    """The app over `svc`. With `sweep_every_s`, a background thread applies node
    silence, finality and nonce expiry, and starts relay checks, at that period."""
    metrics = Metrics()
    pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="db")
    app = FastAPI(
        title="swarmrl orchestrator",
        version="1",
        description="Admits untrusted nodes by key, assigns work, keeps the ledger.",
        lifespan=_lifespan(svc, pool, sweep_every_s),
    )
    app.router.route_class = CheckedRoute
    add_refusals(app)
    signed = Signed(svc, pool)
    # registered in this order, which is the order of the OpenAPI document
    _public_routes(app, svc, metrics)
    _node_routes(app, svc, signed)
    _validator_routes(app, svc, signed)
    _trainer_routes(app, svc, signed)
    _operator_routes(app, svc)
    if svc.cfg.orchestrator.dashboard:
        dashboard.dashboard_routes(app, svc)
    if isinstance(svc.objects, LocalObjectStore):
        _object_routes(app, svc, svc.objects)
    app.add_middleware(BodyLimit, limit=svc.cfg.orchestrator.max_request_bytes)
    app.add_middleware(
        Measure, requests=metrics.requests, latency=metrics.latency, service=metrics.service
    )
    app.openapi = lambda: with_security(app)
    return app


def _public_routes(app: FastAPI, svc: Service, prometheus: Metrics) -> None:
    """Health, metrics, the run's public parameters, servers and dataset, the ledger."""

    @app.get("/health")
    def health() -> dict:
        with svc.db.tx() as cur:
            run = work.run_state(svc, cur)
        return {"ok": True, "run_id": svc.run_id, "engine": svc.db.engine, **run}

    @app.get("/metrics")
    def metrics() -> Response:
        return prometheus.exposition(svc)

    @app.get("/v1/run")
    def run_params() -> dict:
        return public_params(svc)

    @app.get("/v1/run/servers")
    def run_servers() -> dict:
        """The SHARDCAST servers advertised now (nodes refresh their list from it)."""
        with svc.db.read() as cur:
            return {"servers": work.servers(svc, cur)}

    @app.get("/v1/run/dataset", responses={404: {"description": "The run has no dataset file"}})
    def dataset():
        if not svc.cfg.task.dataset:
            raise ApiError(404, "this run generates its problems; there is no dataset file")
        return FileResponse(svc.cfg.task.dataset)

    @app.get("/v1/ledger")
    def ledger() -> dict:
        return work.ledger(svc)


def _node_routes(app: FastAPI, svc: Service, signed: Signed) -> None:
    """Signed by a node: register, heartbeat, upload grants, submit, relay reports."""
    call = signed.call

    @app.post("/v1/nodes/register", responses={**ERRORS, 429: {"description": "Full: retry"}})
    async def register(body: RegisterIn, caller: Caller = signed.newcomer) -> dict:
        if body.role == "worker" and body.hardware is None:
            raise ApiError(422, "a worker must send its hardware report")
        if body.role == "relay" and not body.url:
            raise ApiError(422, "a relay must send its URL")
        hw = body.hardware.model_dump() if body.hardware else {}
        url = body.url.rstrip("/")  # one spelling per relay URL, as reports are read

        def checked_register():  # the nonce is recorded with the registration (auth.py)
            places: list[str] = []
            if body.role == "relay":
                if svc.db.one(
                    "SELECT 1 FROM nonces WHERE key = ? AND nonce = ?", (caller.key, caller.nonce)
                ):
                    raise ApiError(401, "nonce already used")  # a replay resolves nothing
                addresses = relays.check(url, svc.cfg.orchestrator.relay_networks)
                places = relaystanding.endpoints(url, addresses)
            return nodes.register(svc, caller, body.role, hw, url, body.work, body.invite, places)

        return await call(caller, checked_register)

    @app.post("/v1/nodes/heartbeat", responses=ERRORS)
    async def heartbeat(body: HeartbeatIn, caller: Caller = signed.node) -> dict:
        return await call(
            caller, work.heartbeat, svc, caller.key, body.policy_version, body.want_work
        )

    @app.post("/v1/uploads", responses={**ERRORS, 429: {"description": "Rate limited"}})
    async def uploads(body: UploadIn, caller: Caller = signed.live_node) -> dict:
        return await call(
            caller, work.grant_upload, svc, caller.key, body.counter, body.size, body.sha256
        )

    @app.post("/v1/submit", responses=ERRORS)
    async def submit(body: SubmitIn, caller: Caller = signed.live_node) -> dict:
        return await call(caller, work.submit, svc, caller.key, body.key, body.sha256)

    @app.post("/v1/relays/report", responses=ERRORS)
    async def relay_report(body: RelayReportIn, caller: Caller = signed.anyone) -> dict:
        def report():
            if svc.role_of(caller.key) != "validator":
                require_live_node(svc, caller.key)
            return relaystanding.report(svc, caller.key, body.url, body.what)

        return await call(caller, report)


def _validator_routes(app: FastAPI, svc: Service, signed: Signed) -> None:
    """Signed by a validator: claim a file, record its verdict."""

    @app.post("/v1/validation/claim", responses=ERRORS)
    async def claim(body: ClaimIn, caller: Caller = signed.validator) -> dict:
        return await signed.call(
            caller, files.claim_file, svc, caller.key, body.max_policy, body.device
        )

    @app.post("/v1/validation/verdict", responses=ERRORS)
    async def verdict(body: VerdictIn, caller: Caller = signed.validator) -> dict:
        return await signed.call(
            caller, files.record_verdict, svc, caller.key, body.verdict.model_dump()
        )


def _trainer_routes(app: FastAPI, svc: Service, signed: Signed) -> None:
    """Signed by the trainer: open a step, publish, read and consume files, reject, resume,
    report the per-node log-prob mismatch."""
    call, as_trainer = signed.call, signed.trainer

    @app.post("/v1/trainer/step", responses=ERRORS)
    async def trainer_step(body: StepIn, caller: Caller = as_trainer) -> dict:
        return await call(
            caller, files.open_step, svc, body.step, body.sampler.model_dump(), body.done,
            body.device,
        )  # fmt: skip

    @app.post("/v1/trainer/published", responses=ERRORS)
    async def trainer_published(body: VersionIn, caller: Caller = as_trainer) -> dict:
        return await call(caller, files.published, svc, body.version)

    @app.get("/v1/trainer/files", responses=ERRORS)
    async def trainer_files(
        caller: Caller = as_trainer, step: int = Query(ge=0, le=1 << 40)
    ) -> dict:
        return await call(caller, files.trainer_files, svc, step)

    @app.post("/v1/trainer/consume", responses=ERRORS)
    async def trainer_consume(body: ConsumeIn, caller: Caller = as_trainer) -> dict:
        return await call(caller, files.consume, svc, body.step, body.keys)

    @app.post("/v1/trainer/reject", responses=ERRORS)
    async def trainer_reject(body: TrainerRejectIn, caller: Caller = as_trainer) -> dict:
        return await call(caller, files.trainer_reject, svc, body.key, body.reason)

    @app.post("/v1/trainer/mismatch", responses=ERRORS)
    async def trainer_mismatch(body: MismatchIn, caller: Caller = as_trainer) -> dict:
        figures = [n.model_dump() for n in body.nodes]
        return await call(caller, mismatch.record, svc, body.step, figures)

    @app.post("/v1/trainer/metrics", responses=ERRORS)
    async def trainer_metrics(body: MetricsIn, caller: Caller = as_trainer) -> dict:
        """The step's metrics.jsonl row, for the dashboard."""
        return await call(caller, dashboard.record_metrics, svc, body.step, body.row)

    @app.post("/v1/trainer/resume", responses=ERRORS)
    async def trainer_resume(body: VersionIn, caller: Caller = as_trainer) -> dict:
        return await call(caller, files.resume, svc, body.version)


def _operator_routes(app: FastAPI, svc: Service) -> None:
    """The operator's bearer token: the ledger, ban and unban, pause and stop."""

    async def operator(request: Request) -> None:
        require_operator(svc, request)

    operator.authenticate = operator  # CheckedRoute: the token before the body

    as_operator = Depends(operator)

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

    @app.post("/v1/admin/invites", responses=ERRORS)
    def admin_invites(body: InvitesIn, _: None = as_operator) -> dict:
        """Invitations, each admitting one new key with the stake it deposits (shown once:
        only their hashes are kept)."""
        stake = svc.cfg.orchestrator.stake if body.stake is None else body.stake
        return {"invites": admission.issue_invites(svc, body.count, stake), "stake": stake}

    @app.post("/v1/admin/evaluations", responses=ERRORS)
    def admin_evaluation(body: EvaluationIn, _: None = as_operator) -> dict:
        """A held-out score (the launcher's, before and after the run), for the dashboard."""
        return dashboard.record_evaluation(svc, body.name, body.step, body.result)

    @app.post("/v1/admin/run", responses=ERRORS)
    def admin_run(body: RunControlIn, _: None = as_operator) -> dict:
        with svc.db.tx() as cur:
            if body.paused is not None:
                svc.set_meta(cur, "paused", "1" if body.paused else "0")
            if body.stopped:
                svc.set_meta(cur, "stopped", "1")
                svc.set_meta(cur, "done", "1")
            return work.run_state(svc, cur)


def _object_routes(app: FastAPI, svc: Service, store: LocalObjectStore) -> None:
    """The local object store: uploads and downloads checked by their HMAC-signed URLs."""

    @app.put("/objects/{key:path}", responses=ERRORS)
    async def put_object(key: str, request: Request) -> dict:
        try:
            query = dict(request.query_params)
            size, digest = store.check_upload(
                key, query, request.headers.get("content-length"), svc.clock(),
            )  # fmt: skip
            # a URL granted before its node was ejected stops here (read off the event loop)
            rows = await asyncio.get_running_loop().run_in_executor(
                None, svc.db.one, "SELECT state FROM nodes WHERE key = ?", (query["node"],)
            )
            if not rows or rows[0][0] in ("ejected", "banned"):
                raise ObjectError(403, "the node this URL was granted to may no longer upload")
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
