"""Relays for the orchestrator's relay checks, on loopback: an honest one (a real
SHARDCAST origin serving signed versions) and `FakeRelay`, which serves whatever a
test hands it, hostile answers included."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time

from aiohttp import web

from swarmrl.protocol.manifest import FileEntry, Manifest, Shard
from swarmrl.shardcast.local import LocalWeights
from swarmrl.shardcast.origin import Origin
from tests.unit.shardcast_util import SHARD, publish


def honest_relay(tmp, key, versions=(0,), port: int = 0) -> Origin:
    """A SHARDCAST server serving `versions`, signed by `key` (the run's trainer key)."""
    w = LocalWeights(tmp / f"relay-{port}-{time.monotonic_ns()}", keep=8, key=key,
                     shard_bytes=SHARD)  # fmt: skip
    for v in versions:
        publish(w, v, size=SHARD + 7)
    origin = Origin(w, port=port)
    origin.start()
    return origin


def manifest_bytes(version: int, key=None, forge: bool = False) -> bytes:
    """A manifest of `version`, signed by `key` if given; `forge`: signed, then altered."""
    data = b"weights"
    digest = hashlib.sha256(data).hexdigest()
    shard = Shard(offset=0, size=len(data), sha256=digest)
    m = Manifest(version=version, created=time.time(),
                 files=[FileEntry(name="model.safetensors", size=len(data), sha256=digest,
                                  shards=[shard])])  # fmt: skip
    if key is not None:
        m = m.signed(key)
    if forge:
        m = m.model_copy(update={"created": m.created + 1.0})
    return json.dumps(m.model_dump()).encode()


class FakeRelay:
    """Serves `/versions` and `/v/N/manifest.json` from `handlers` (name -> aiohttp
    handler), on a loop of its own; `url` once started."""

    def __init__(self, versions, manifest):
        self.loop = asyncio.new_event_loop()
        app = web.Application()
        app.add_routes([web.get("/versions", versions),
                        web.get("/v/{version}/manifest.json", manifest)])  # fmt: skip
        self.runner = web.AppRunner(app, shutdown_timeout=0.1, handle_signals=False)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        port = self._run(self._start())
        self.url = f"http://127.0.0.1:{port}"

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    async def _start(self) -> int:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return site._server.sockets[0].getsockname()[1]

    async def _shutdown(self) -> None:
        await self.runner.cleanup()
        handlers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in handlers:  # those still hanging or dripping
            t.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)

    def stop(self) -> None:
        self._run(self._shutdown())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


def versions_of(*versions: int):
    async def handler(_request):
        return web.json_response({"versions": list(versions)})

    return handler


def body_of(data: bytes):
    async def handler(_request):
        return web.Response(body=data, content_type="application/json")

    return handler
