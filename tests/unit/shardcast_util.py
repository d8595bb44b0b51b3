"""Shared pieces of the SHARDCAST unit tests: a signing key, an origin, relays on one loop."""

from __future__ import annotations

import asyncio
import json
import os
import time
from contextlib import asynccontextmanager

from swarmrl.protocol.identity import public_key_hex
from swarmrl.shardcast.local import LocalWeights
from swarmrl.shardcast.origin import Origin
from swarmrl.shardcast.relay import serve_relay

SHARD = 64 * 1024


def publish(w: LocalWeights, v: int, size: int = 5 * SHARD + 123) -> bytes:
    data = os.urandom(size)
    d = w.staging_dir(v)
    (d / "model.safetensors").write_bytes(data)
    (d / "config.json").write_text(json.dumps({"v": v}))
    w.publish(v)
    return data


def make_origin(tmp_path, key, keep=3, rate=0.0) -> tuple[LocalWeights, Origin]:
    pub = public_key_hex(key)
    w = LocalWeights(tmp_path / "origin", keep=keep, key=key, shard_bytes=SHARD, trusted_key=pub)
    return w, Origin(w, max_bytes_per_s=rate)


async def start_relays(urls, pub, tmp_path, stop, n=2, **kw) -> list[str]:
    ports: list[int] = []
    for i in range(n):
        asyncio.create_task(
            serve_relay(urls, pub, tmp_path / f"relay-{i}", stop=stop, on_ready=ports.append, **kw)
        )
    while len(ports) < n:
        await asyncio.sleep(0.01)
    return [f"http://127.0.0.1:{p}" for p in ports]


async def until(cond, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


@asynccontextmanager
async def serving(routes):
    """A stand-in server on loopback with aiohttp `routes`; its URL. A request it
    still holds (a long poll) does not hold up the end of the test."""
    from aiohttp import web

    app = web.Application()
    app.add_routes(routes)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    finally:
        await runner.cleanup()
