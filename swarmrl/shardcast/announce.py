"""Which versions each SHARDCAST server announces: a long poll of its `/versions`
per server, and the list of servers followed as the orchestrator changes it.

`Announcements` is the discovery half of the client's `Follower` (client.py): it
keeps each server's announced versions in its `ServerStats` and sets the pool's
`changed` event, on which the follower's main loop decides what to fetch. It uses
the follower's `pool`, `poll_wait_s`, `servers_from`, `refresh_s` and
`_failed_at` (versions given up on, and when).

Each server has a poll task of its own, bounded by `poll_wait_s` + 15 s: a server
that holds or trickles its answer delays only what it announces itself, never
the fetch of a version another server announced. Only believed servers'
announcements choose what is fetched (servers.py: a server that broke a promise
is not believed while it backs off).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

import aiohttp

from swarmrl.shardcast.servers import ServerStats

log = logging.getLogger("swarmrl.shardcast.client")

POLL_WAIT_S = 30.0
POLL_RETRY_S = 1.0
MAX_VERSIONS_BYTES = 64 * 1024
MAX_ANNOUNCED = 64  # per server: the newest ones; retention keeps a handful anyway


class BadStatus(RuntimeError):
    """A server's answer of the wrong status or length."""


class BadBody(ValueError):
    """A server's answer that no honest server sends (too large, malformed)."""


async def read_limited(resp: aiohttp.ClientResponse, limit: int, what: str) -> bytes:
    """The whole body, however many reads it takes; more than `limit` bytes is an error."""
    if resp.content_length is not None and resp.content_length > limit:
        raise BadBody(f"{what} of {resp.content_length} bytes, limit {limit}")
    data = bytearray()
    while len(data) <= limit:
        chunk = await resp.content.read(limit + 1 - len(data))
        if not chunk:
            return bytes(data)
        data += chunk
    raise BadBody(f"{what} larger than {limit} bytes")


class Announcements:
    """The follower's discovery (see the module)."""

    async def _poll(self, session: aiohttp.ClientSession, s: ServerStats) -> None:
        after = -1
        while True:
            t0 = time.monotonic()
            try:
                url = f"{s.url}/versions?after={after}&wait={self.poll_wait_s}"
                timeout = aiohttp.ClientTimeout(total=self.poll_wait_s + 15)
                async with session.get(url, timeout=timeout) as r:
                    if r.status != 200:
                        raise BadStatus(f"HTTP {r.status}")
                    body = json.loads(await read_limited(r, MAX_VERSIONS_BYTES, "/versions"))
                versions = body["versions"] if isinstance(body, dict) else None
                if not isinstance(versions, list) or not all(
                    type(v) is int and 0 <= v < 1 << 53 for v in versions
                ):
                    raise BadBody("malformed /versions answer")
            except asyncio.CancelledError:
                raise
            except Exception as e:
                # Recovered: a server we cannot reach, or that answers nonsense, announces
                # nothing until it answers again; asked again every second (a relay often
                # starts before its upstream).
                if s.versions or isinstance(e, BadBody):
                    log.warning("server %s: /versions failed (%s)", s.url, e)
                s.versions = []
                # asked for all it has, it answers at once when back: asked for what
                # comes after the last version it announced (a relay restarted with that
                # version), it would hold the answer for poll_wait_s, announcing
                # nothing meanwhile (the emulated swarm: relays stalled for 30 s)
                after = -1
                self.pool.changed.set()
                await asyncio.sleep(POLL_RETRY_S)
                continue
            new = sorted(set(versions))[-MAX_ANNOUNCED:]
            fresh = set(new) - set(s.versions)
            changed = new != s.versions
            s.versions = new
            if fresh and not s.broke_promise:
                # a version this server did not announce before (a relay back from a
                # restart, or one that has just got it) is worth a try now, though it
                # was given up on or the server is backing off: waiting those out
                # stalled the emulated swarm's nodes for 28 s after a relay's restart.
                # Not from a server that broke a promise: a liar announcing a new
                # fake version in every answer would never back off.
                for v in fresh:
                    self._failed_at.pop(v, None)
                s.backoff_until = 0.0
            if s.versions:
                after = s.versions[-1]
            self.pool.changed.set()
            if not changed and time.monotonic() - t0 < POLL_RETRY_S:
                await asyncio.sleep(POLL_RETRY_S)  # an answer that did not wait: pace it

    async def _refresh(self, session: aiohttp.ClientSession, polls: dict) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            try:
                urls = await asyncio.to_thread(self.servers_from)
            except Exception as e:  # recovered: the current list stays until the next try
                log.warning("could not refresh the server list: %s", e)
                continue
            if not urls:
                log.warning("the server list came back empty; keeping %d", len(polls))
                continue
            added, withdrawn = self.pool.update(urls)
            for s in withdrawn:
                polls.pop(s.url).cancel()
            for s in added:
                polls[s.url] = asyncio.create_task(self._poll(session, s))
            if added or withdrawn:
                log.info("servers: +%s -%s", [s.url for s in added], [s.url for s in withdrawn])

    def _announced(self) -> set[int]:
        """The versions announced by the servers that are believed now."""
        now = time.monotonic()
        return {v for s in self.pool.servers.values() if s.believed(now) for v in s.versions}
