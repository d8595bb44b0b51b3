"""The SHARDCAST HTTP server, shared by the origin (in the trainer) and relays.

API (all GET; JSON unless noted):
- `/health`: role and the versions served.
- `/versions?after=N&wait=S`: the versions this server announces; a long poll,
  answered as soon as a version newer than N is announced, or after S seconds
  (at most 60). This is how relays and clients learn of a new version at once
  rather than by polling on a timer.
- `/v/{version}/manifest.json`: the signed manifest, as published (bytes).
- `/v/{version}/{file}/{shard}`: one shard's bytes (application/octet-stream).
  `Range: bytes=a-` or `bytes=a-b` (relative to the shard) answers 206; this
  is how a client resumes a shard after a broken connection.

A shard that is complete on disk is sent with `loop.sendfile` (zero copy:
sendfile(2) on Linux). A relay announces a version as soon as it has verified
its manifest; a request for a shard still in flight is streamed as bytes land
and waits for the rest, instead of failing. Bytes served before the relay has
checked the shard's hash are not trusted by anyone: every client checks every
shard against the signed manifest.

Names in URLs are checked against patterns and the manifest, never joined
into a path unchecked: traversal gets 404, malformed numbers 400, a range
outside the shard 416. `max_bytes_per_s` caps the upload rate of the server
(a volunteer's relay may want to); it is also how tests slow a relay down.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from swarmrl.protocol.manifest import Manifest

log = logging.getLogger("swarmrl.shardcast.server")

MAX_WAIT_S = 60.0
STALL_S = 120.0  # an in-flight shard that makes no progress this long ends the response
SEND_BLOCK = 4 << 20
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}$")
_DIGITS = re.compile(r"[0-9]{1,12}")  # ASCII only: str.isdigit() accepts "²"
_RANGE = re.compile(r"^bytes=(\d{1,15})-(\d{0,15})$")


@dataclass
class ServedVersion:
    """A version a server announces. `ready[(file, shard)]` counts the bytes of
    that shard on disk, contiguous from its start; complete versions have all."""

    manifest: Manifest
    manifest_bytes: bytes
    directory: Path
    complete: bool
    ready: dict[tuple[str, int], int] = field(default_factory=dict)

    @property
    def version(self) -> int:
        return self.manifest.version

    def available(self, name: str, index: int) -> int:
        if self.complete:
            return self.manifest.file(name).shards[index].size
        return self.ready.get((name, index), 0)


class VersionTable:
    """What a server announces. Lives on the server's event loop (not thread-safe:
    other threads go through `loop.call_soon_threadsafe`)."""

    def __init__(self) -> None:
        self.entries: dict[int, ServedVersion] = {}
        self._changed = asyncio.Event()
        self._progress = asyncio.Event()

    def versions(self) -> list[int]:
        return sorted(self.entries)

    def announce(self, entry: ServedVersion) -> None:
        self.entries[entry.version] = entry
        self._signal_change()

    def drop(self, version: int) -> None:
        if self.entries.pop(version, None) is not None:
            self._signal_change()
            self.notify_progress()

    def mark_complete(self, version: int) -> None:
        entry = self.entries.get(version)
        if entry is not None:
            entry.complete = True
            entry.ready.clear()
            self.notify_progress()

    def progress(self, version: int, name: str, index: int, nbytes: int) -> None:
        entry = self.entries.get(version)
        if entry is not None:
            entry.ready[(name, index)] = nbytes
            self.notify_progress()

    def notify_progress(self) -> None:
        self._progress.set()
        self._progress = asyncio.Event()

    def _signal_change(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_change(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except TimeoutError:
            pass

    async def wait_progress(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._progress.wait(), timeout)
            return True
        except TimeoutError:
            return False


def _int_param(request: web.Request, name: str, default: float) -> float:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise web.HTTPBadRequest(text=f"query parameter {name!r} must be a number") from None
    if not (value == value) or value < -1 or value > 1e15:  # NaN or absurd
        raise web.HTTPBadRequest(text=f"query parameter {name!r} out of range")
    return value


def _version(request: web.Request, table: VersionTable) -> ServedVersion:
    raw = request.match_info["version"]
    if not _DIGITS.fullmatch(raw):
        raise web.HTTPBadRequest(text="version must be a non-negative integer")
    entry = table.entries.get(int(raw))
    if entry is None:
        raise web.HTTPNotFound(text=f"version {int(raw)} is not served here")
    return entry


def _shard_range(header: str | None, size: int) -> tuple[int, int]:
    if header is None:
        return 0, size
    m = _RANGE.match(header.strip())
    if m is None:
        raise web.HTTPRequestRangeNotSatisfiable(text="only 'bytes=a-' or 'bytes=a-b' ranges")
    start = int(m.group(1))
    end = int(m.group(2)) + 1 if m.group(2) else size
    if start >= size or end > size or end <= start:
        raise web.HTTPRequestRangeNotSatisfiable(
            headers={"Content-Range": f"bytes */{size}"}, text="range outside the shard"
        )
    return start, end


class ShardServer:
    def __init__(self, table: VersionTable, role: str, max_bytes_per_s: float = 0.0):
        self.table = table
        self.role = role
        self.max_bytes_per_s = max_bytes_per_s
        self.bytes_sent = 0
        self._pace_at = 0.0  # with an upload cap: when the next byte may leave (all responses)
        self.app = web.Application(client_max_size=1024)
        self.app.add_routes(
            [
                web.get("/health", self.health),
                web.get("/versions", self.versions),
                web.get("/v/{version}/manifest.json", self.manifest),
                web.get("/v/{version}/{name}/{index}", self.shard),
            ]
        )
        self.runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self, host: str, port: int) -> int:
        # Long polls and streams in flight get 1 s to finish when the server stops.
        self.runner = web.AppRunner(
            self.app, access_log=None, handle_signals=False, shutdown_timeout=1.0
        )
        await self.runner.setup()
        site = web.TCPSite(self.runner, host, port, reuse_address=True)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"role": self.role, "versions": self.table.versions()})

    async def versions(self, request: web.Request) -> web.Response:
        after = _int_param(request, "after", -1)
        wait = min(max(_int_param(request, "wait", 0), 0), MAX_WAIT_S)
        deadline = time.monotonic() + wait
        while True:
            versions = self.table.versions()
            left = deadline - time.monotonic()
            if (versions and versions[-1] > after) or left <= 0:
                return web.json_response({"versions": versions})
            await self.table.wait_change(left)

    async def manifest(self, request: web.Request) -> web.Response:
        entry = _version(request, self.table)
        return web.Response(body=entry.manifest_bytes, content_type="application/json")

    async def shard(self, request: web.Request) -> web.StreamResponse:
        entry = _version(request, self.table)
        name, raw_index = request.match_info["name"], request.match_info["index"]
        if not _NAME.match(name):
            raise web.HTTPNotFound(text="no such file")
        if not _DIGITS.fullmatch(raw_index):
            raise web.HTTPBadRequest(text="shard index must be a non-negative integer")
        fe = entry.manifest.file(name)
        index = int(raw_index)
        if fe is None or index >= len(fe.shards):
            raise web.HTTPNotFound(text="no such file or shard")
        shard = fe.shards[index]
        start, end = _shard_range(request.headers.get("Range"), shard.size)
        resp = web.StreamResponse(status=206 if "Range" in request.headers else 200)
        resp.content_length = end - start
        resp.content_type = "application/octet-stream"
        resp.headers["X-Shard-Sha256"] = shard.sha256
        if resp.status == 206:
            resp.headers["Content-Range"] = f"bytes {start}-{end - 1}/{shard.size}"
        try:
            f = open(entry.directory / fe.name, "rb")  # noqa: SIM115 (closed below)
        except FileNotFoundError:  # dropped by retention between lookup and open
            raise web.HTTPNotFound(text="version was dropped") from None
        try:
            await resp.prepare(request)
            await self._send(request, resp, f, entry, name, index, shard.offset, start, end)
            await resp.write_eof()
        except (ConnectionResetError, BrokenPipeError):
            # Recovered: the client went away, or we cannot finish this body (version
            # dropped, upstream stalled). Close the connection so the client sees the
            # short body at once and fails over, instead of waiting on a kept-alive socket.
            if request.transport is not None:
                request.transport.close()
        finally:
            f.close()
        return resp

    async def _send(self, request, resp, f, entry, name, index, base, start, end) -> None:
        loop = asyncio.get_running_loop()
        transport = request.transport
        pos = start
        while pos < end:
            if transport is None or transport.is_closing():
                raise ConnectionResetError("client went away")
            avail = min(entry.available(name, index), end)
            if avail <= pos:
                if self.table.entries.get(entry.version) is not entry:
                    raise ConnectionResetError("version dropped while in flight")
                if not await self.table.wait_progress(STALL_S):
                    raise ConnectionResetError(f"shard {name}/{index} stalled upstream")
                continue
            n = avail - pos
            if self.max_bytes_per_s > 0:
                n = min(n, max(int(self.max_bytes_per_s / 10), 1 << 16))
                # one budget for the whole server, shared by every response in flight
                now = time.monotonic()
                start_at = max(now, self._pace_at)
                self._pace_at = start_at + n / self.max_bytes_per_s
                await asyncio.sleep(start_at - now)
            else:
                n = min(n, SEND_BLOCK * 16)
            await loop.sendfile(transport, f, base + pos, n)
            pos += n
            self.bytes_sent += n
