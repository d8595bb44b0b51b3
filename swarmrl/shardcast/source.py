"""Where a node's weights come from: chosen from config here, and only here.

With `shardcast.enabled` (the default) a worker or validator mirrors versions
from SHARDCAST servers into its own cache directory with a `Follower` on a
background thread; otherwise it reads the trainer's weights directory
directly (one machine, shared disk). Both answer `newest()` and
`open_verified(version)`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from pathlib import Path

from swarmrl.config import ConfigError, RunConfig
from swarmrl.protocol.manifest import ManifestError
from swarmrl.shardcast.client import Fetched, Follower
from swarmrl.shardcast.local import LocalWeights

log = logging.getLogger("swarmrl.shardcast")


class ShardcastWeights:
    """A node's view of the policy versions it has downloaded through SHARDCAST."""

    def __init__(self, follower: Follower):
        self.follower = follower
        self.local = follower.local
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def start(self) -> ShardcastWeights:
        ready = threading.Event()

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            ready.set()
            await self.follower.run(self._stop)

        def target() -> None:
            try:
                asyncio.run(main())
            except BaseException as e:  # surfaced by newest(): the node must not go on blind
                self.error = e
                ready.set()

        self._thread = threading.Thread(target=target, daemon=True, name="shardcast")
        self._thread.start()
        ready.wait()
        return self

    def newest(self) -> int | None:
        if self.error is not None:
            raise RuntimeError(f"SHARDCAST client failed: {self.error!r}") from self.error
        return self.local.newest()

    def open_verified(self, version: int) -> Path:
        """The version's directory after a whole-file check. A copy that fails the
        check (torn by a crash: downloads are not fsynced) is deleted, and the
        caller gets FileNotFoundError and looks again; the follower refetches it.
        The version stays pinned (never deleted by retention) until the next call."""
        self.local.pinned = version  # retention keeps it while the worker loads it
        try:
            return self.local.open_verified(version)
        except ManifestError as e:
            log.warning("local copy of version %d is damaged (%s); deleting it", version, e)
            self.local.delete(version)
            raise FileNotFoundError(f"version {version} was damaged and deleted") from e

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout=10)


def trainer_public_key(cfg: RunConfig) -> str:
    if cfg.shardcast.public_key:
        return cfg.shardcast.public_key
    path = cfg.paths.keys / "trainer.pub"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        raise ConfigError(
            f"no trainer public key: set shardcast.public_key or create {path}"
        ) from None


def open_weights_source(
    cfg: RunConfig,
    node_name: str,
    keep: int | None = None,
    client=None,
    *,
    root: Path | None = None,
    servers: list[str] | None = None,
    trusted_key: str | None = None,
    latency_log: Path | None = None,
):
    """The weights source of one node (worker or validator) of this run. A
    validator passes `keep`: it mirrors every version and keeps that many.
    `client`: an OrchestratorClient; servers that send bad data are reported to it.
    Where SHARDCAST mirrors to (`root`, `latency_log`) and from (`servers`, signed
    by `trusted_key`) default to the run directory and the config; a remote worker,
    which has no run directory, passes its own folder and what the orchestrator
    announced."""
    if not cfg.shardcast.enabled:
        return LocalWeights(cfg.paths.weights)
    return follow_weights(
        cfg,
        cfg.paths.nodes / node_name / "weights" if root is None else root,
        cfg.shardcast.servers if servers is None else servers,
        trainer_public_key(cfg) if trusted_key is None else trusted_key,
        node_name,
        cfg.paths.run / "weights_latency.jsonl" if latency_log is None else latency_log,
        keep=keep,
        client=client,
    )


def follow_weights(
    cfg: RunConfig,
    root: Path,
    servers: list[str],
    trusted_key: str,
    node_name: str,
    latency_log: Path,
    keep: int | None = None,
    client=None,
) -> ShardcastWeights:
    """Mirror versions from `servers` into `root` on a background thread."""
    if not servers:
        raise ConfigError("no SHARDCAST servers: give the URLs of relays or the origin")

    def report(url: str, what: str) -> None:
        """Called on the follower's event loop: the report goes out on its own thread."""
        if client is None:
            return

        def send() -> None:
            from swarmrl.protocol.client import OrchestratorClient

            c = OrchestratorClient(client.url, client.key, patience_s=30.0)
            try:
                c.call("POST", "/v1/relays/report", {"url": url, "what": what[:500]})
            except Exception as e:  # recovered: a lost report only delays the relay's removal
                log.warning("could not report %s to the orchestrator: %s", url, e)
            finally:
                c.close()

        threading.Thread(target=send, daemon=True, name="relay-report").start()

    refresher = None
    if client is not None:

        def current_servers() -> list[str]:
            """The orchestrator's advertised servers (on the follower's thread pool,
            with a client of its own: the node's main client is not shared)."""
            from swarmrl.protocol.client import OrchestratorClient

            c = OrchestratorClient(client.url, client.key, patience_s=30.0)
            try:
                return c.servers()
            finally:
                c.close()

        refresher = current_servers

    def record(f: Fetched) -> None:
        row = {
            "version": f.version,
            "node": node_name,
            "latency_s": round(f.latency_s, 4),
            "download_s": round(f.seconds, 4),
            "bytes": f.bytes,
            "full_bytes": f.full_bytes,
            "patched_from": f.patched_from,
            "time": time.time(),
        }
        with open(latency_log, "a") as fh:
            fh.write(json.dumps(row) + "\n")

    follower = Follower(
        servers,
        trusted_key,
        root,
        keep=keep or cfg.shardcast.keep_local,
        every=keep is not None,
        parallel=cfg.shardcast.parallel,
        direct_io=cfg.shardcast.direct_io,
        poll_wait_s=cfg.shardcast.poll_wait_s,
        on_fetched=record,
        on_bad_data=report,
        servers_from=refresher,
        refresh_s=cfg.shardcast.servers_refresh_s,
        patches=cfg.shardcast.use_patches,
    )
    return ShardcastWeights(follower).start()
