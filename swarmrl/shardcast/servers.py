"""Which server a shard comes from: the client's view of its servers.

Each server has exponential moving averages (alpha 0.3) of throughput (bytes/s)
and success (0..1). A shard goes to the server with the best
throughput x success / (1 + downloads in progress there). A server not yet
measured is tried first, and stays "unmeasured" after a failure, so it is
explored again once its backoff ends. A failure lowers its throughput and
success and backs it off exponentially (0.25 s doubling to 30 s). Only servers
that announce the version are asked for its shards.

A server that announced a version and then did not serve its manifest (an
error, the deadline, a manifest of another version or unsigned) has broken a
promise: while it backs off, what it announces is not believed (it chooses
nothing the follower fetches, and a version it announces anew does not end its
backoff), until one of its manifests verifies. A liar announcing versions that
do not exist is thereby asked about one of them per backoff, which doubles.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from swarmrl.errors import UserError

log = logging.getLogger("swarmrl.shardcast.client")

EMA_ALPHA = 0.3
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.25, 30.0
UNMEASURED_BPS = 1e11  # optimistic: a server not yet measured is tried early


class ShardcastError(UserError, RuntimeError):
    """A download that cannot go on: no servers given, or a shard no server delivers."""


@dataclass
class ServerStats:
    url: str
    ema_bps: float | None = None
    ema_ok: float = 1.0
    failures: int = 0
    backoff_until: float = 0.0
    active: int = 0
    bad_shards: int = 0
    bytes: int = 0
    versions: list[int] = field(default_factory=list)
    withdrawn: bool = False  # no longer advertised by the orchestrator: not polled, not picked
    broke_promise: bool = False  # announced a version, then did not serve its manifest

    def believed(self, now: float) -> bool:
        """Whether what it announces counts (see the module)."""
        return not self.withdrawn and not (self.broke_promise and self.backoff_until > now)

    def score(self) -> float:
        bps = self.ema_bps if self.ema_bps is not None else UNMEASURED_BPS
        return bps * self.ema_ok / (1 + self.active)


class ServerPool:
    """Per-server throughput and success, and the choice of a server per shard."""

    def __init__(self, urls: list[str], on_bad_data: Callable[[str, str], None] | None = None):
        if not urls:
            raise ShardcastError("no SHARDCAST servers given")
        self.servers = {u.rstrip("/"): ServerStats(u.rstrip("/")) for u in urls}
        self.changed = asyncio.Event()
        self.on_bad_data = on_bad_data

    def update(self, urls: list[str]) -> tuple[list[ServerStats], list[ServerStats]]:
        """Follow a new list of servers: (servers to start polling, servers withdrawn).
        A withdrawn server keeps its record (a shard in flight may still name it)
        but announces nothing, so it is never picked; listed again, it comes back."""
        want = {u.rstrip("/") for u in urls}
        added, withdrawn = [], []
        for u in sorted(want):
            s = self.servers.get(u)
            if s is None:
                s = self.servers[u] = ServerStats(u)
            elif not s.withdrawn:
                continue
            s.withdrawn = False
            added.append(s)
        for u, s in self.servers.items():
            if u not in want and not s.withdrawn:
                s.withdrawn = True
                s.versions = []
                withdrawn.append(s)
        if added or withdrawn:
            self.changed.set()
        return added, withdrawn

    def pick(self, version: int, exclude: set[str]) -> ServerStats | None:
        now = time.monotonic()
        ok = [
            s
            for s in self.servers.values()
            if s.url not in exclude and version in s.versions and s.backoff_until <= now
        ]
        return max(ok, key=ServerStats.score) if ok else None

    def success(self, s: ServerStats, nbytes: int, seconds: float) -> None:
        bps = nbytes / max(seconds, 1e-6)
        s.ema_bps = bps if s.ema_bps is None else EMA_ALPHA * bps + (1 - EMA_ALPHA) * s.ema_bps
        s.ema_ok = EMA_ALPHA + (1 - EMA_ALPHA) * s.ema_ok
        s.failures = 0
        s.bytes += nbytes

    def failure(self, s: ServerStats, why: str) -> None:
        if s.ema_bps is not None:  # unmeasured stays unmeasured: tried again after backoff
            s.ema_bps = (1 - EMA_ALPHA) * s.ema_bps
        s.ema_ok = (1 - EMA_ALPHA) * s.ema_ok
        s.failures += 1
        delay = min(BACKOFF_MAX_S, BACKOFF_MIN_S * 2 ** (s.failures - 1))
        s.backoff_until = time.monotonic() + delay
        log.warning("server %s failed (%s); backing off %.2fs", s.url, why, delay)

    def bad_data(self, s: ServerStats, what: str) -> None:
        s.bad_shards += 1
        self.failure(s, f"served bad data: {what}")
        log.error("server %s served bad data (%s)", s.url, what)
        if self.on_bad_data is not None:
            self.on_bad_data(s.url, what)

    def next_ready_in(self, version: int, exclude: set[str]) -> float | None:
        """Seconds until some non-excluded server announcing `version` leaves backoff."""
        now = time.monotonic()
        waits = [
            max(0.0, s.backoff_until - now)
            for s in self.servers.values()
            if s.url not in exclude and version in s.versions
        ]
        return min(waits) if waits else None

    def snapshot(self) -> dict[str, dict]:
        return {
            u: {
                "ema_MBps": None if s.ema_bps is None else round(s.ema_bps / 1e6, 2),
                "ema_ok": round(s.ema_ok, 3),
                "bad_shards": s.bad_shards,
                "MB": round(s.bytes / 1e6, 1),
            }
            for u, s in self.servers.items()
        }
