"""The simulated nodes of bench/orchestrator_load.py: what each one does (`Load`), their
signed HTTP calls with client-side timing (`Swarm`, `Recorder`), and the worker's two
loops (the background heartbeat, and ask for work / generate / upload / submit)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import time
from collections import Counter
from dataclasses import dataclass, field

import aiohttp
from nacl.signing import SigningKey
from yarl import URL

from swarmrl.protocol.signing import sign_request

HARDWARE = {"cpus": 4, "memory_gb": 16.0, "tokens_per_s": 500.0}


@dataclass(frozen=True)
class Load:
    """What each simulated node does, and for how long it is measured."""

    heartbeat_s: float
    file_s: float
    file_bytes: int
    seconds: float
    warmup_s: float


@dataclass
class Recorder:
    """Client-side timings and errors of the requests that start inside [start, end)."""

    start: float = math.inf
    end: float = math.inf
    latency: dict[str, list[float]] = field(default_factory=dict)
    errors: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    outside_errors: int = 0
    waits: Counter = field(default_factory=Counter)
    assignments: int = 0

    def add(self, endpoint: str, t0: float, seconds: float, error: str | None) -> None:
        if not self.start <= t0 < self.end:
            self.outside_errors += error is not None
            if error is not None and len(self.examples) < 5:
                self.examples.append(f"(outside the window) {endpoint}: {error}")
            return
        self.latency.setdefault(endpoint, []).append(seconds)
        if error is not None:
            self.errors[endpoint] += 1
            if len(self.examples) < 10:
                self.examples.append(f"{endpoint}: {error}")


class Swarm:
    """The simulated nodes' side of HTTP: signed JSON calls, timing. Each node calls
    through one of `sessions`, by its key; the first session is also the trainer's
    and the operator's (`session`)."""

    def __init__(self, url: str, sessions: list[aiohttp.ClientSession], rec: Recorder):
        self.url = url
        self.sessions = sessions
        self.session = sessions[0]
        self.rec = rec
        self.run_id = ""

    def session_of(self, key: SigningKey) -> aiohttp.ClientSession:
        return self.sessions[int.from_bytes(bytes(key.verify_key)[:4]) % len(self.sessions)]

    async def send(
        self, endpoint: str, method: str, url, session: aiohttp.ClientSession | None = None, **kw
    ) -> tuple[int, bytes]:
        """(status, body) of one request, timed and recorded; status 0: no answer."""
        t0 = time.monotonic()
        try:
            async with (session or self.session).request(method, url, **kw) as r:
                raw, status = await r.read(), r.status
        except (aiohttp.ClientError, TimeoutError) as e:
            # Recovered: counted as an error; the node carries on as a worker would.
            raw, status = f"{type(e).__name__}: {e}".encode(), 0
        ok = 200 <= status < 300
        error = None if ok else f"{status} {raw[:160].decode(errors='replace')}"
        self.rec.add(endpoint, t0, time.monotonic() - t0, error)
        return status, raw

    async def call(self, key: SigningKey, endpoint: str, path: str, body: dict):
        """(status, answer) of a signed POST; answer is None unless the status is 2xx."""
        content = json.dumps(body).encode()
        headers = sign_request(key, self.run_id, "POST", path, content)
        headers["Content-Type"] = "application/json"
        status, raw = await self.send(
            endpoint, "POST", self.url + path, self.session_of(key), data=content, headers=headers
        )
        return status, json.loads(raw) if 200 <= status < 300 else None

    async def put(self, key: SigningKey, url: str, data: bytes) -> bool:
        status, _ = await self.send(
            "PUT /objects", "PUT", URL(url, encoded=True), self.session_of(key), data=data
        )
        return 200 <= status < 300

    async def register(self, key: SigningKey, invite: str = "") -> bool:
        """Register (a new key with the operator's invitation; a known one again)."""
        body = {"role": "worker", "hardware": HARDWARE, **({"invite": invite} if invite else {})}
        status, _ = await self.call(key, "register", "/v1/nodes/register", body)
        return status == 200


async def sleep_until(t: float, end: float) -> bool:
    """Sleep until monotonic time `t`; False (at once) when `t` is past `end`."""
    if t >= end:
        return False
    await asyncio.sleep(max(0.0, t - time.monotonic()))
    return True


async def heartbeat_loop(swarm: Swarm, key: SigningKey, load: Load, t: float, end: float):
    """The worker's background heartbeat, from time `t` on."""
    body = {"policy_version": 0, "want_work": False}
    while await sleep_until(t, end):
        status, _ = await swarm.call(key, "heartbeat", "/v1/nodes/heartbeat", body)
        if status == 409:  # declared dead: join again, as the worker does
            await swarm.register(key)
        t += load.heartbeat_s


async def work_loop(swarm: Swarm, key: SigningKey, load: Load, t: float, end: float, rng):
    """The worker's main loop: ask for work, 'generate' for file_s, upload, submit."""
    body = {"policy_version": 0, "want_work": True}
    first = True
    while await sleep_until(t, end):
        _, hb = await swarm.call(key, "heartbeat want_work", "/v1/nodes/heartbeat", body)
        if hb is None or hb["assignment"] is None:
            if hb is not None:
                swarm.rec.waits[hb["wait"]] += 1
            t = time.monotonic() + load.heartbeat_s
            continue
        swarm.rec.assignments += swarm.rec.start <= time.monotonic() < swarm.rec.end
        spread = rng.uniform(0.0, 1.0) if first else rng.uniform(0.8, 1.2)
        first = False
        if not await sleep_until(time.monotonic() + spread * load.file_s, end):
            return
        await upload(swarm, key, hb["assignment"]["counter"], os.urandom(load.file_bytes))
        t = time.monotonic()


async def upload(swarm: Swarm, key: SigningKey, counter: int, data: bytes) -> None:
    sha = hashlib.sha256(data).hexdigest()
    body = {"counter": counter, "size": len(data), "sha256": sha}
    _, grant = await swarm.call(key, "uploads", "/v1/uploads", body)
    if grant is None or not await swarm.put(key, grant["url"], data):
        return
    await swarm.call(key, "submit", "/v1/submit", {"key": grant["key"], "sha256": sha})


async def loop_lag(end: float, rec: Recorder, out: list[float], period: float = 0.05) -> None:
    """How late the event loop wakes a sleeper, inside the window: the client's own delay."""
    while time.monotonic() < end:
        t = time.monotonic()
        await asyncio.sleep(period)
        if t >= rec.start:
            out.append(time.monotonic() - t - period)


async def register_all(swarm: Swarm, keys: list[SigningKey], token: str, parallel: int = 32) -> int:
    """Register every key with an invitation from the operator, `parallel` at a time
    (the faucet is left to the sybils of the hostile mix); how many were admitted."""
    invites: list[str] = []
    while len(invites) < len(keys):
        count = min(1000, len(keys) - len(invites))
        async with swarm.session.post(
            swarm.url + "/v1/admin/invites",
            json={"count": count},
            headers={"Authorization": f"Bearer {token}"},
        ) as r:
            if r.status != 200:
                raise RuntimeError(f"/v1/admin/invites answered {r.status}: {await r.text()}")
            invites += (await r.json())["invites"]
    gate = asyncio.Semaphore(parallel)

    async def one(key: SigningKey, invite: str) -> bool:
        async with gate:
            return await swarm.register(key, invite)

    return sum(await asyncio.gather(*(one(k, i) for k, i in zip(keys, invites, strict=True))))


async def open_run(swarm: Swarm, trainer: SigningKey) -> None:
    """The trainer opens step 1 with version 0 published; work can be assigned."""
    for endpoint, path, body in (
        ("trainer step", "/v1/trainer/step", {"step": 1}),
        ("trainer published", "/v1/trainer/published", {"version": 0}),
    ):
        status, _ = await swarm.call(trainer, endpoint, path, body)
        if status != 200:
            raise RuntimeError(f"{path} answered {status}: {swarm.rec.examples[-1:]}")
