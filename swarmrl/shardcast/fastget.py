"""A lean HTTP/1.1 GET for shard bodies: keep-alive sockets, one reused buffer.

Why not aiohttp here: receiving through aiohttp allocates a new bytes object per
socket read (up to 256 KB), and on a busy machine the allocator hands that
memory back and forth with the kernel: in the 8-client benchmark this cost
more CPU (page faults, system time) than receiving the data itself. This path
reads with `sock_recv_into` into one preallocated buffer per connection and
hands `memoryview` slices to the caller (who writes and hashes them), so the
steady state allocates nothing. Discovery, manifests and https URLs still use
aiohttp; this speaks only plain-HTTP GET with a Content-Length, which is what
our servers send for shards.

A response without Content-Length, with a status other than the expected one,
or with headers over 16 KB is an error; the connection is then closed, never
reused. An idle connection is reused only after a response was read to its end.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from urllib.parse import urlsplit

BUFFER = 1 << 20
MAX_HEADER = 16 * 1024


class HttpError(ConnectionError):
    """The server answered something other than the expected body (or nothing)."""


class _Conn:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = bytearray(BUFFER)
        self.view = memoryview(self.buf)
        self.responded = False  # any byte of an answer received on this socket


class FastGet:
    """Keep-alive connections per server; `get()` streams a body to a callback."""

    def __init__(self, idle_timeout_s: float = 60.0):
        self.idle_timeout_s = idle_timeout_s
        self._idle: dict[tuple[str, int], list[_Conn]] = {}

    @staticmethod
    def supports(url: str) -> bool:
        return urlsplit(url).scheme == "http"

    async def _connect(self, host: str, port: int) -> _Conn:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, type_, proto, _, addr = infos[0]
        sock = socket.socket(family, type_, proto)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            async with asyncio.timeout(10):
                await loop.sock_connect(sock, addr)
        except BaseException:
            sock.close()
            raise
        return _Conn(sock)

    async def get(
        self,
        url: str,
        headers: dict[str, str],
        expect_status: int,
        expect_length: int,
        on_data: Callable[[memoryview], None],
    ) -> None:
        """GET `url`; require `expect_status` and a Content-Length of
        `expect_length`; pass the body to `on_data` in slices of one buffer
        (valid only during the call)."""
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port or 80
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        key = (host, port)
        idle = self._idle.get(key)
        reused = bool(idle)
        conn = idle.pop() if idle else await self._connect(host, port)
        reusable = False
        try:
            reusable = await self._exchange(
                conn, host, port, path, headers, expect_status, expect_length, on_data
            )
        except (HttpError, OSError):
            if not (reused and not conn.responded):
                raise
            # A kept-alive socket the server had closed (it restarted, or timed the
            # connection out) fails before any answer: one retry on a fresh socket. GET
            # is idempotent, and nothing was handed to on_data.
            conn.sock.close()
            self._drop_idle(key)
            conn = await self._connect(host, port)
            reusable = await self._exchange(
                conn, host, port, path, headers, expect_status, expect_length, on_data
            )
        finally:
            if reusable:
                self._idle.setdefault(key, []).append(conn)
            else:
                conn.sock.close()

    def _drop_idle(self, key) -> None:
        for c in self._idle.pop(key, []):
            c.sock.close()

    async def _exchange(self, conn, host, port, path, headers, status, length, on_data) -> bool:
        """One request and its response; True when the connection may be reused."""
        loop = asyncio.get_running_loop()
        lines = [f"GET {path} HTTP/1.1", f"Host: {host}:{port}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        await loop.sock_sendall(conn.sock, ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        async with asyncio.timeout(self.idle_timeout_s) as deadline:
            # headers
            have = 0
            while True:
                n = await loop.sock_recv_into(conn.sock, conn.view[have:MAX_HEADER])
                if n == 0:
                    raise HttpError("connection closed before the response headers")
                conn.responded = True
                have += n
                end = conn.buf.find(b"\r\n\r\n", 0, have)
                if end >= 0:
                    break
                if have >= MAX_HEADER:
                    raise HttpError("response headers larger than 16 KB")
                deadline.reschedule(loop.time() + self.idle_timeout_s)
            head = bytes(conn.buf[:end]).decode("latin-1").split("\r\n")
            try:
                got_status = int(head[0].split(" ", 2)[1])
            except (IndexError, ValueError):
                raise HttpError(f"malformed status line {head[0][:80]!r}") from None
            fields = {}
            for line in head[1:]:
                name, _, value = line.partition(":")
                fields[name.strip().lower()] = value.strip()
            if got_status != status:
                raise HttpError(f"HTTP {got_status}")
            if "chunked" in fields.get("transfer-encoding", "").lower():
                raise HttpError("chunked response where a Content-Length was expected")
            if fields.get("content-length") != str(length):
                raise HttpError(f"Content-Length {fields.get('content-length')}, expected {length}")
            # body: what came with the headers, then straight into the buffer
            body_start = end + 4
            extra = have - body_start
            if extra > length:
                raise HttpError("more bytes than the Content-Length")
            if extra:
                on_data(conn.view[body_start:have])
            left = length - extra
            while left:
                n = await loop.sock_recv_into(conn.sock, conn.view[: min(BUFFER, left)])
                if n == 0:
                    raise HttpError(f"connection closed with {left} bytes of the body missing")
                on_data(conn.view[:n])
                left -= n
                deadline.reschedule(loop.time() + self.idle_timeout_s)
        return fields.get("connection", "").lower() != "close"

    def close(self) -> None:
        for conns in self._idle.values():
            for c in conns:
                c.sock.close()
        self._idle.clear()
