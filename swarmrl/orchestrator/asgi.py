"""The ASGI layer under the orchestrator's routes: the request-body limit
(`BodyLimit`), request counts and latency (`Measure`), and the Prometheus
registry they feed with the node and file counts (`Metrics`). Both middlewares
are plain ASGI: Starlette's `@app.middleware` wrapper was most of the
orchestrator's CPU under load (bench/orchestrator_load.py)."""

from __future__ import annotations

import time

from fastapi.responses import Response
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from swarmrl.orchestrator import nodes, work
from swarmrl.orchestrator.service import ApiError, Service


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


class Measure:
    """Count requests by route and status and time them (Prometheus), as a plain
    ASGI middleware: the route is known once the router has matched it.

    Two times per request: `latency`, from its headers to its answer, which holds
    the wait for its body over the client's link; and `service`, from the request
    being whole (its last body byte read, or its headers for a request whose body
    is never read) to its answer: the orchestrator's own time. In the emulated swarm
    (bench/swarm_scale.py) the two differ by the clients' links: a heartbeat's body
    queued behind its worker's file upload on a 10 Mbit/s link, or resent after a
    drop, waited up to 240 ms while the service took under 5 ms."""

    def __init__(self, app, requests, latency, service):
        self.app = app
        self.requests = requests
        self.latency = latency
        self.service = service

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        whole = t0  # when the request was whole
        status = 500

        async def receiving():
            nonlocal whole
            msg = await receive()
            if msg["type"] == "http.request" and not msg.get("more_body", False):
                whole = time.perf_counter()
            return msg

        async def sending(msg):
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
            await send(msg)

        try:
            await self.app(scope, receiving, sending)
        finally:
            route = scope.get("route")
            name = route.path if route is not None else "other"
            t = time.perf_counter()
            self.requests.labels(name, str(status)).inc()
            self.latency.labels(name).observe(t - t0)
            self.service.labels(name).observe(t - whole)


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


# seconds; fine between 10 and 100 ms, where a p99 goal (50 ms) is read off
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 1.0, 5.0)


class Metrics:
    """The Prometheus registry of one app: request counts and latency (fed by
    `Measure`), and node and file counts by state (read from the database
    when /metrics is scraped)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "swarmrl_requests", "API requests", ["route", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "swarmrl_request_seconds", "API latency: from the request's headers to its answer", ["route"], registry=self.registry,
            buckets=LATENCY_BUCKETS,
        )  # fmt: skip
        self.service = Histogram(
            "swarmrl_service_seconds", "API service time: from the request whole to its answer",
            ["route"], registry=self.registry, buckets=LATENCY_BUCKETS,
        )  # fmt: skip
        self.node_states = Gauge(
            "swarmrl_nodes", "Nodes by state", ["state"], registry=self.registry
        )
        self.file_states = Gauge(
            "swarmrl_files", "Rollout files by state", ["state"], registry=self.registry
        )

    def exposition(self, svc: Service) -> Response:
        """The metrics in Prometheus' text format, with the state counts read now."""
        with svc.db.read() as cur:
            ns = dict(cur.execute("SELECT state, COUNT(*) FROM nodes GROUP BY state").fetchall())
            fs = dict(cur.execute("SELECT state, COUNT(*) FROM files GROUP BY state").fetchall())
        for s in nodes.STATES:
            self.node_states.labels(s).set(ns.get(s, 0))
        for s in work.FILE_STATES:
            self.file_states.labels(s).set(fs.get(s, 0))
        return Response(generate_latest(self.registry), media_type="text/plain; version=0.0.4")
