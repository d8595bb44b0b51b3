"""The SHARDCAST origin: the trainer's weights directory, published and served.

`Publisher` takes each version off the training loop: the trainer hands over
a snapshot of the weights (a CPU copy of the state dict) and returns to
training at once, while a background thread writes the HF files, hashes them
shard by shard, writes the signed manifest (last, atomically), applies
retention (`async_level + 1` versions) and tells the origin. Versions are
published in order, one at a time; an error in the thread is raised by the
next `submit` or `flush`, so a failed publish stops the trainer.

`Origin` serves that directory with `ShardServer` from an event loop on its
own thread (inside the trainer process, or alone as `swarmrl origin`). It
announces a version when its manifest exists and drops it when retention
deleted it; `sync()` rescans the directory and is safe to call from any thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from swarmrl.protocol.manifest import MANIFEST, ManifestError, read_manifest
from swarmrl.shardcast.local import LocalWeights
from swarmrl.shardcast.server import ServedVersion, ShardServer, VersionTable

log = logging.getLogger("swarmrl.shardcast.origin")


class Origin:
    def __init__(
        self, weights: LocalWeights, host: str = "127.0.0.1", port: int = 0, max_bytes_per_s=0.0
    ):
        self.weights = weights
        self.host = host
        self.port = port
        self.max_bytes_per_s = max_bytes_per_s
        self.loop: asyncio.AbstractEventLoop | None = None
        self.table: VersionTable | None = None
        self.server: ShardServer | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> str:
        ready = threading.Event()
        errors: list[BaseException] = []

        async def main() -> None:
            self.loop = asyncio.get_running_loop()
            self._stopped = asyncio.Event()
            self.table = VersionTable()
            self.server = ShardServer(self.table, "origin", self.max_bytes_per_s)
            try:
                self.port = await self.server.start(self.host, self.port)
                self._sync()
            except BaseException as e:  # reported to the caller of start()
                errors.append(e)
                ready.set()
                return
            ready.set()
            await self._stopped.wait()
            await self.server.stop()

        self._thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
        self._thread.start()
        ready.wait()
        if errors:
            raise errors[0]
        log.info("SHARDCAST origin serving %s at %s", self.weights.root, self.url)
        return self.url

    def sync(self) -> None:
        self.loop.call_soon_threadsafe(self._sync)

    def _sync(self) -> None:
        on_disk = set(self.weights.versions())
        for v in list(self.table.entries):
            if v not in on_disk:
                self.table.drop(v)
        for v in sorted(on_disk - set(self.table.entries)):
            d = self.weights.path(v)
            try:
                manifest = read_manifest(d)
                raw = (d / MANIFEST).read_bytes()
            except (FileNotFoundError, ManifestError) as e:
                log.warning("not serving version %d: %s", v, e)
                continue
            self.table.announce(ServedVersion(manifest, raw, d, complete=True))

    def stop(self) -> None:
        if self.loop is not None and self._thread is not None:
            self.loop.call_soon_threadsafe(self._stopped.set)
            self._thread.join(timeout=10)


class Publisher:
    """Publish versions on one background thread, in submission order."""

    def __init__(self, weights: LocalWeights, origin: Origin | None = None):
        self.weights = weights
        self.origin = origin
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="publish")
        self._pending: list[Future] = []
        self._failure: BaseException | None = None

    def submit(
        self, version: int, write: Callable[[Path], None], then: Callable[[], None] | None = None
    ) -> None:
        self.raise_failures()
        self._pending.append(self._pool.submit(self._publish, version, write, then))

    def _publish(self, version: int, write, then) -> None:
        if self._failure is not None:  # never publish past a version that failed
            raise RuntimeError(f"not publishing version {version}: an earlier publish failed")
        try:
            d = self.weights.staging_dir(version)
            write(d)
            self.weights.publish(version)
            if self.origin is not None:
                self.origin.sync()
            if then is not None:
                then()
        except BaseException as e:
            self._failure = e
            raise

    def raise_failures(self) -> bool:
        """Re-raise, in the caller's thread, the error of a publish that failed; False
        while none has (a `should_stop` for a wait)."""
        done = [f for f in self._pending if f.done()]
        self._pending = [f for f in self._pending if not f.done()]
        for f in done:
            f.result()  # re-raises the publish thread's error here, in the trainer
        return False

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        for f in pending:
            f.result()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._pool.shutdown(wait=True)


def serve_directory(root: Path, host: str, port: int, max_bytes_per_s: float = 0.0) -> None:
    """`swarmrl origin`: serve a weights directory another process publishes into.

    Versions are picked up by rescanning every 0.2 s (the in-trainer origin is
    told at once instead). Runs until SIGTERM or SIGINT.
    """
    import signal
    import time

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    origin = Origin(LocalWeights(root, keep=1 << 30), host, port, max_bytes_per_s)
    origin.start()
    print(f"origin listening on {origin.url}", flush=True)
    try:
        while not stop.is_set():
            origin.sync()
            time.sleep(0.2)
    finally:
        origin.stop()
