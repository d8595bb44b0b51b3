"""`swarmrl relay`: a SHARDCAST middle node.

A relay follows one or more upstream servers (the origin or other relays:
relays chain) with a `Follower`, and serves what it has with a `ShardServer`.
It announces a version as soon as its manifest is verified against the
trainer's key, and serves shards while they are still arriving (see
server.py). It keeps the newest `keep` versions and deletes a version once
no upstream serves it any longer. On restart it serves the complete versions
it has on disk whose signature and files still verify (hashing them: writes
are not fsynced, so a crash can tear a file), and deletes the rest.

A relay is semi-trusted: it cannot forge a manifest (it has no key), and a
shard it corrupts is caught by the client's hash check and refetched elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from pathlib import Path

from swarmrl.errors import ConfigError
from swarmrl.protocol.manifest import MANIFEST, ManifestError, verify_version
from swarmrl.shardcast.client import Follower
from swarmrl.shardcast.local import LocalWeights
from swarmrl.shardcast.server import ServedVersion, ShardServer, VersionTable
from swarmrl.shardcast.servers import ShardcastError

log = logging.getLogger("swarmrl.shardcast.relay")


def _load_existing(local: LocalWeights, trusted_key: str, table: VersionTable) -> None:
    for v in local.versions():
        d = local.path(v)
        try:
            manifest = verify_version(d, trusted_key, patches=True)  # writes are not fsynced
        except ManifestError as e:
            log.warning("deleting version %d on disk: %s", v, e)
            local.delete(v)
            continue
        table.announce(ServedVersion(manifest, (d / MANIFEST).read_bytes(), d, complete=True))


async def serve_relay(
    upstreams: list[str],
    trusted_key: str,
    root: Path,
    host: str = "127.0.0.1",
    port: int = 0,
    keep: int = 3,
    parallel: int = 4,
    max_bytes_per_s: float = 0.0,
    poll_wait_s: float = 30.0,
    stop: asyncio.Event | None = None,
    on_ready=None,
) -> None:
    if not upstreams:
        raise ShardcastError("a relay needs at least one upstream URL (--upstream)")
    stop = stop or asyncio.Event()
    table = VersionTable()
    local = LocalWeights(root, keep=keep, trusted_key=trusted_key)
    _load_existing(local, trusted_key, table)
    server = ShardServer(table, "relay", max_bytes_per_s)
    port = await server.start(host, port)
    log.info("relay serving %s at http://%s:%d, following %s", root, host, port, upstreams)
    if on_ready is not None:
        on_ready(port)
    follower = Follower(
        upstreams,
        trusted_key,
        root,
        keep=keep,
        parallel=parallel,
        follow_drops=True,
        poll_wait_s=poll_wait_s,
        on_manifest=lambda m, raw, d: table.announce(ServedVersion(m, raw, d, complete=False)),
        on_progress=table.progress,
        on_complete=table.mark_complete,
        on_drop=table.drop,
        mirror_patches=True,  # a relay serves the patches on, to nodes that hold the base
    )
    follow = asyncio.create_task(follower.run(stop))
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait([follow, stopping], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (follow, stopping):
            t.cancel()
        await asyncio.gather(stopping, return_exceptions=True)
        try:
            await follow
        except asyncio.CancelledError:
            pass
        await server.stop()


def run_relay(upstreams: list[str], trusted_key: str, root: Path, **kw) -> None:
    """Blocking entry point: run until SIGTERM or SIGINT."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve_relay(upstreams, trusted_key, root, stop=stop, **kw)

    asyncio.run(main())


def relay_public_url(host: str, port: int, public_url: str | None) -> str:
    """The URL a relay registers with the orchestrator, which nodes then use to reach it:
    `public_url` when given, else http://HOST:PORT. That default names no reachable
    address for a port picked at random (0) or a wildcard host, so it is refused there."""
    if not public_url and (port == 0 or host in ("0.0.0.0", "::")):
        raise ConfigError(
            "a relay that registers with the orchestrator needs --public-url "
            "(or a fixed --port and a concrete --host)"
        )
    return public_url or f"http://{host}:{port}"


def join_orchestrator(url: str, key_file: Path, public_url: str) -> None:
    """Register this relay with the run's orchestrator and heartbeat on a daemon
    thread, so it is advertised to nodes (and can be reported by them)."""
    import threading

    from swarmrl.protocol.client import OrchestratorClient, OrchestratorError
    from swarmrl.protocol.identity import load_or_create_key

    client = OrchestratorClient(url, load_or_create_key(key_file))

    def beat() -> None:
        every = client.run_params()["heartbeat_s"]
        try:
            client.register({"role": "relay", "url": public_url})
        except OrchestratorError as e:  # e.g. its address is not one the operator allows
            log.error("the orchestrator refuses this relay (it serves on, unlisted): %s", e)
            return
        while True:
            time.sleep(every)
            try:
                client.call("POST", "/v1/nodes/heartbeat", {"want_work": False})
            except OrchestratorError as e:
                if e.status != 409:
                    log.error("the orchestrator refuses this relay: %s", e)
                    return
                client.register({"role": "relay", "url": public_url})
            except ConnectionError as e:  # recovered: it keeps serving; heartbeats resume later
                log.warning("heartbeat: %s", e)

    threading.Thread(target=beat, daemon=True, name="orchestrator").start()
