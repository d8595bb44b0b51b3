"""Limits on the orchestrator's connections, enforced below HTTP, before any route
runs: what uvicorn does not bound by itself.

uvicorn (0.54) waits forever for a request's head, reads headers of any size, and
holds any number of connections, so one client dripping a header byte a second
(slow-loris) keeps a connection, and 50 of them keep 50. `guarded_protocol` is
uvicorn's httptools protocol with these rules added (`ConnectionLimits`, from
`[orchestrator]`):

- **Head**: a request's line and headers must arrive within `header_timeout_s`
  of the connection opening or of the request's first byte, and be at most
  `max_header_bytes`; otherwise 408 or 431, and the connection is closed.
- **Body**: a body must arrive within `body_timeout_s` plus its length at
  `min_body_bytes_per_s`, the length being the declared one but at most the
  route's largest body: `max_upload_bytes` (`orchestrator.max_file_bytes`) for
  an object upload (a path under `/objects/`), `max_request_bytes` for the API.
  A chunked body is costed at that largest body. Otherwise 408 and closed. So a
  declared length never sets a deadline beyond what the route would accept.
  The time counts while the route has not read what came (flow control), which
  the routes do at once. Sizes are refused before the body is read by the
  routes themselves (`asgi.BodyLimit`, the object store's signed size).
- **Answered early**: when the route has answered and the request's body has
  not all arrived (a refusal such as 413, 401 or 403), the connection is closed
  after the answer: the write side is shut, what the client still sends is read
  and dropped for `LINGER_S` (so that it can read the answer), then the
  connection is closed. A request whose body arrived whole keeps the connection
  alive.
- **Answer**: a client that leaves `send_timeout_s` without reading the answer
  it asked for is cut off.
- **Idle**: a kept-alive connection with no new request for `idle_timeout_s`
  is closed (uvicorn's keep-alive timeout).
- **How many**: at most `max_connections_per_client` open connections per
  client (an IPv4 address, or an IPv6 /64: what one subscriber is usually
  given) and `max_connections` in all, the latter lowered to what the
  process's file limit allows; a connection over either is answered 429 or
  503 at once and closed.

The time the routes themselves take is not limited here: it is the server's,
not the client's. The client is the socket's peer: behind a reverse proxy every
request comes from the proxy, and the proxy must apply per-client limits itself.
The rules hook uvicorn's parser callbacks (`on_message_begin`,
`on_headers_complete`, `on_message_complete`), its end-of-answer callback
(`on_response_complete`) and its flow-control calls; the
tests in tests/unit/test_orchestrator_connections.py drive each against a real
server, so a uvicorn release that changes them fails there.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import resource
from dataclasses import dataclass, field, replace

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("swarmrl.orchestrator")

LINGER_S = 1.0  # after a refusal, input is read and dropped this long before closing
FILES_RESERVED = 256  # descriptors kept for the database, the object store and logs

STATUS_TEXT = {
    408: b"Request Timeout",
    429: b"Too Many Requests",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    min_body_bytes_per_s: float = 64 * 1024
    send_timeout_s: float = 30.0
    idle_timeout_s: float = 5.0
    max_header_bytes: int = 32 * 1024
    max_request_bytes: int = 1 << 20
    max_upload_bytes: int = 64 << 20
    max_connections: int = 4096
    max_connections_per_client: int = 64

    @classmethod
    def from_config(cls, o) -> ConnectionLimits:
        """The limits of an `OrchestratorConfig`."""
        return cls(
            header_timeout_s=o.header_timeout_s,
            body_timeout_s=o.body_timeout_s,
            min_body_bytes_per_s=o.min_body_bytes_per_s,
            send_timeout_s=o.send_timeout_s,
            idle_timeout_s=o.idle_timeout_s,
            max_header_bytes=o.max_header_bytes,
            max_request_bytes=o.max_request_bytes,
            max_upload_bytes=o.max_file_bytes,
            max_connections=o.max_connections,
            max_connections_per_client=o.max_connections_per_client,
        )


def client_of(host: str) -> str:
    """Who a peer address counts as: the IPv4 address (also when written as an
    IPv6-mapped one), or the IPv6 /64 it lies in."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host  # a Unix socket's peer, say: counted by its name
    if ip.version == 6 and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    if ip.version == 6:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


@dataclass
class ConnectionTally:
    """Open connections in all and per client, for one server."""

    limits: ConnectionLimits
    total: int = 0
    per_client: dict[str, int] = field(default_factory=dict)
    refused: int = 0

    def admit(self, client: str) -> int | None:
        """Count a new connection from `client`, or the status that refuses it."""
        if self.total >= self.limits.max_connections:
            self.refused += 1
            return 503
        if self.per_client.get(client, 0) >= self.limits.max_connections_per_client:
            self.refused += 1
            return 429
        self.total += 1
        self.per_client[client] = self.per_client.get(client, 0) + 1
        return None

    def release(self, client: str) -> None:
        self.total -= 1
        left = self.per_client[client] - 1
        if left:
            self.per_client[client] = left
        else:
            del self.per_client[client]


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the module's limits; `guarded_protocol`
    makes one subclass per server, holding its limits and tally."""

    limits: ConnectionLimits
    tally: ConnectionTally

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0
        self._in_head = True  # waiting for a request head (the connection's first, or next)
        self._closed_by_us = False
        self._who = client_of(self.client[0]) if self.client else "unknown"
        refusal = self.tally.admit(self._who)
        self._counted = refusal is None
        if refusal is not None:
            self._close_with(refusal, linger=False)
            return
        self._arm(self.limits.header_timeout_s, 408)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._counted:
            self._counted = False
            self.tally.release(self._who)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._closed_by_us:
            return
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._head_bytes > self.limits.max_header_bytes:
            self._close_with(431)

    # Parser callbacks: a refused connection's leftover bytes change nothing.
    def on_message_begin(self) -> None:
        if self._closed_by_us:
            return
        super().on_message_begin()
        if not self._in_head:  # a request after the first on this connection
            self._in_head = True
            self._head_bytes = 0
            self._arm(self.limits.header_timeout_s, 408)

    def on_url(self, url: bytes) -> None:
        if not self._closed_by_us:
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._closed_by_us:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._closed_by_us:
            return
        self._in_head = False
        super().on_headers_complete()  # sets the scope's path, which `_body_deadline` reads
        self._arm(self._body_deadline(), 408)

    def on_body(self, body: bytes) -> None:
        if not self._closed_by_us:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._closed_by_us:
            return
        self._disarm()  # the rest is the server's time, until the answer is written
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        cycle = self.cycle
        # the answered request is `cycle` when it is complete (a pipelined request
        # waiting to start is not); `more_body` is still set if its body was cut short
        if (
            self._closed_by_us
            or self.transport.is_closing()
            or not (cycle.response_complete and cycle.more_body)
        ):
            return
        self._unset_keepalive_if_required()
        self._shut(linger=True)

    def send_400_response(self, msg: str) -> None:
        if not self._closed_by_us:
            super().send_400_response(msg)

    # Flow control: the client must keep reading its answer.
    def pause_writing(self) -> None:
        super().pause_writing()
        if not self._closed_by_us:
            self._arm(self.limits.send_timeout_s, None)

    def resume_writing(self) -> None:
        super().resume_writing()
        if not self._closed_by_us and not self._in_head:
            self._disarm()

    def _body_deadline(self) -> float:
        """Seconds the request's body has: `body_timeout_s` plus its length at
        `min_body_bytes_per_s`, the length being the declared one but at most the
        route's largest body (the largest, for a chunked body)."""
        if self.scope.get("path", "").startswith("/objects/"):
            cap = self.limits.max_upload_bytes
        else:
            cap = self.limits.max_request_bytes
        length = cap
        for name, value in self.headers:
            if name == b"content-length" and value.isdigit() and value.isascii():
                length = min(int(value), cap)
        return self.limits.body_timeout_s + length / self.limits.min_body_bytes_per_s

    def _arm(self, seconds: float, status: int | None) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, self._expired, status)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self, status: int | None) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        if status is None:  # the answer was not read: nothing more can be said
            self._closed_by_us = True
            self.transport.abort()
            return
        self._close_with(status)

    def _close_with(self, status: int, linger: bool = True) -> None:
        """Answer `status` (unless an answer is under way) and close the connection,
        lingering as `_shut` does when an answer was written."""
        self._closed_by_us = True
        self._disarm()
        cycle = self.cycle
        can_answer = cycle is None or cycle.response_complete
        if not can_answer and not cycle.response_started:
            # the route still reads the body: its reads end (the client is gone, for
            # it), and what it answers goes nowhere; the status below is the answer
            cycle.disconnected = True
            cycle.message_event.set()
            can_answer = True
        if can_answer:
            text = STATUS_TEXT[status]
            body = b'{"detail":"%s"}' % text
            self.transport.write(
                b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n%s"
                % (status, text, len(body), body)
            )
        self._shut(linger and can_answer)

    def _shut(self, linger: bool) -> None:
        """Close the connection, writing nothing more.

        With `linger`, the write side is shut first and what the client still sends
        is read and dropped for up to LINGER_S: closing a socket with unread input
        resets the connection, and the client would lose the answer."""
        self._closed_by_us = True
        self._disarm()
        if linger and self.transport.can_write_eof():
            self.transport.write_eof()
            self.flow.resume_reading()  # a route that stopped reading left reads paused
            self._timer = self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()


def usable_connections(wanted: int) -> int:
    """`wanted`, or as many connections as the process's file limit allows (raising
    its soft limit toward the hard one first)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + FILES_RESERVED
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass  # keep the soft limit; the cap is lowered to fit it below
    if soft == resource.RLIM_INFINITY:
        return wanted
    fits = max(1, soft - FILES_RESERVED)
    if fits < wanted:
        log.warning(
            "orchestrator.max_connections %d lowered to %d: the file limit is %d",
            wanted,
            fits,
            soft,
        )
    return min(wanted, fits)


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedProtocol]:
    """A protocol class for `uvicorn.Config(http=...)` enforcing `limits`, with a
    tally of its own (one per server)."""
    limits = replace(limits, max_connections=usable_connections(limits.max_connections))
    return type(
        "GuardedProtocol",
        (GuardedProtocol,),
        {"limits": limits, "tally": ConnectionTally(limits)},
    )


def server_config(app, host: str, port: int, limits: ConnectionLimits, **kwargs):
    """The `uvicorn.Config` of an orchestrator: `app` on host:port under `limits`.
    Forwarded-for headers are not read: the peer is the connection's (uvicorn would
    otherwise take any loopback caller's X-Forwarded-For as its address, and a local
    process could claim any address range; ranges.py)."""
    import uvicorn

    protocol = guarded_protocol(limits)
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=protocol,
        timeout_keep_alive=limits.idle_timeout_s,  # type: ignore[arg-type]
        **{"proxy_headers": False, **kwargs},
    )
