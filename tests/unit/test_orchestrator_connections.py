"""The connection limits (orchestrator/connections.py) against a real orchestrator
served by uvicorn on loopback, driven with raw sockets the way an attacker would:
slow heads, endless headers, slow bodies, answers left unread, and too many
connections from one address or in all, bodies declared far larger than they are
sent. Clients come from distinct loopback addresses (127.0.0.2, 127.0.0.3, ...),
as distinct machines would."""

from __future__ import annotations

import re
import socket
import threading
import time
from dataclasses import replace

import pytest

from swarmrl.launch.supervisor import free_port
from swarmrl.orchestrator.app import build_app
from swarmrl.orchestrator.connections import (
    LINGER_S,
    ConnectionLimits,
    client_of,
    server_config,
)
from swarmrl.protocol.identity import public_key_hex
from tests.unit.orch_util import Orch

FAST = ConnectionLimits(
    header_timeout_s=1.0,
    body_timeout_s=1.0,
    min_body_bytes_per_s=1e9,
    send_timeout_s=1.0,
    idle_timeout_s=1.0,
    max_header_bytes=8192,
    max_connections=6,
    max_connections_per_client=3,
)
# a body's time follows its length here: 1 s plus 1 ms a byte, up to the route's cap
# (5 s for an API body, 2 s for an object upload)
METERED = replace(FAST, min_body_bytes_per_s=1000.0, max_request_bytes=4000, max_upload_bytes=1000)


class Served:
    """The orchestrator's app on 127.0.0.1 under `limits`, in a thread."""

    def __init__(self, tmp_path, limits: ConnectionLimits):
        import uvicorn

        self.orch = Orch(tmp_path)
        self.port = free_port()
        config = server_config(
            build_app(self.orch.svc), "127.0.0.1", self.port, limits, log_level="error"
        )
        self.server = uvicorn.Server(config)
        self.tally = config.http.tally
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)

    def connect(self, source: str = "127.0.0.2", rcvbuf: int | None = None) -> socket.socket:
        s = socket.socket()
        if rcvbuf is not None:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.bind((source, 0))
        s.connect(("127.0.0.1", self.port))
        s.settimeout(10)
        return s

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.orch.svc.db.close()


@pytest.fixture
def served(tmp_path):
    s = Served(tmp_path, FAST)
    yield s
    s.stop()


@pytest.fixture
def metered(tmp_path):
    s = Served(tmp_path, METERED)
    yield s
    s.stop()


def answer(s: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: o\r\n\r\n".encode()


def test_a_slow_head_is_cut_off_with_408(served):
    s = served.connect()
    t0 = time.monotonic()
    s.sendall(b"POST /v1/nodes/heartbeat HTTP/1.1\r\nHost: o\r\n")
    closed = b""
    for _ in range(40):  # one header byte every 0.1 s, for up to 4 s
        try:
            s.sendall(b"X")
        except OSError:
            break
        s.settimeout(0.1)
        try:
            closed = s.recv(4096)
            break
        except TimeoutError:
            continue
    held = time.monotonic() - t0
    assert closed.startswith(b"HTTP/1.1 408 "), closed
    assert held < 3.0, f"held for {held:.1f} s with a 1 s header timeout"


def test_a_silent_connection_is_closed(served):
    s = served.connect()
    t0 = time.monotonic()
    assert answer(s).startswith(b"HTTP/1.1 408 ")
    assert time.monotonic() - t0 < 3.0


def test_endless_headers_get_431(served):
    s = served.connect()
    s.sendall(b"GET /v1/run HTTP/1.1\r\nHost: o\r\n")
    try:
        for _ in range(100):  # 100 kB of headers against a limit of 8 kB
            s.sendall(b"X-Pad: " + b"a" * 1000 + b"\r\n")
    except OSError:
        pass  # closed while we were still sending
    assert answer(s).startswith(b"HTTP/1.1 431 ")


def test_a_slow_body_is_cut_off_with_408(served):
    s = served.connect()
    s.sendall(
        b"POST /v1/nodes/heartbeat HTTP/1.1\r\nHost: o\r\nContent-Type: application/json\r\n"
        b'Content-Length: 1000\r\n\r\n{"a":'
    )
    t0 = time.monotonic()
    reply = answer(s)
    # the route answers first (401: nobody signed it) or the body timer does (408);
    # either way the connection does not outlive the body timeout
    assert reply.startswith((b"HTTP/1.1 401 ", b"HTTP/1.1 408 ")), reply[:80]
    assert time.monotonic() - t0 < 3.0


def until_closed(s: socket.socket, seconds: float) -> tuple[bytes, float | None]:
    """What the server sends while the client drips two body bytes a second, for
    up to `seconds`; and when it ended the connection (None: it did not)."""
    t0 = time.monotonic()
    got = b""
    s.settimeout(0.5)
    while time.monotonic() - t0 < seconds:
        try:
            chunk = s.recv(65536)
            if not chunk:
                return got, time.monotonic() - t0
            got += chunk
        except TimeoutError:
            try:
                s.sendall(b"0")
            except OSError:  # reset: the server closed it
                return got, time.monotonic() - t0
        except ConnectionResetError:
            return got, time.monotonic() - t0
    return got, None


def wait_for_no_connections(served, seconds: float) -> float | None:
    """Seconds until the server holds no connection, within `seconds`, or None."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        if served.tally.total == 0:
            return time.monotonic() - t0
        time.sleep(0.02)
    return None


@pytest.mark.parametrize(
    "head, status",
    [
        (b"POST /v1/nodes/heartbeat HTTP/1.1\r\nHost: o\r\n"
         b"Content-Length: 1000000000000\r\n\r\n{", b"413"),
        (b"POST /v1/nodes/register HTTP/1.1\r\nHost: o\r\n"
         b"Content-Length: 1000000000\r\n\r\n{", b"413"),
        (b"PUT /objects/a/b.bin?node=n&size=5&sha256=s&expires=9999999999&sig=bad HTTP/1.1\r\n"
         b"Host: o\r\nContent-Length: 1000000000000\r\n\r\n{", b"403"),
    ],
    ids=["heartbeat", "register", "object"],
)  # fmt: skip
def test_a_refused_body_closes_its_connection_after_the_answer(metered, head, status):
    s = metered.connect()
    try:
        s.sendall(head)
        got, ended = until_closed(s, 4.0)
        assert got.startswith(b"HTTP/1.1 " + status + b" "), got[:80]
        assert got.count(b"HTTP/1.1 ") == 1, got  # the refusal, and nothing after it
        assert ended is not None and ended < 1.0, f"the connection was held past {ended} s"
        gone = wait_for_no_connections(metered, LINGER_S + 1.0)
        assert gone is not None, "the server still holds the connection after lingering"
    finally:
        s.close()


def test_a_body_declared_past_its_routes_cap_has_the_caps_time(metered):
    orch = metered.orch
    worker = orch.worker("w")
    orch.register(worker)
    size = 1_000_000  # 1001 s at 1000 B/s; the upload cap of 1000 bytes gives 2 s
    url = orch.svc.objects.upload_url(
        "up/slow.bin", public_key_hex(worker), size, "0" * 64, int(time.time()) + 60
    )
    target = url.split("//", 1)[1].split("/", 1)[1]
    s = metered.connect()
    try:
        s.sendall(f"PUT /{target} HTTP/1.1\r\nHost: o\r\nContent-Length: {size}\r\n\r\n".encode())
        got, ended = until_closed(s, 5.0)
        assert got.startswith(b"HTTP/1.1 408 "), got[:80]
        assert ended is not None and 1.5 < ended < 3.0, ended
    finally:
        s.close()


def test_a_body_read_whole_keeps_its_connection(metered):
    s = metered.connect()
    try:
        s.sendall(
            b"POST /v1/nodes/heartbeat HTTP/1.1\r\nHost: o\r\nContent-Type: application/json\r\n"
            b"Content-Length: 2\r\n\r\n{}"
        )
        assert s.recv(65536).startswith(b"HTTP/1.1 401 ")  # unsigned, and still kept
        s.sendall(get("/v1/run"))
        assert s.recv(65536).startswith(b"HTTP/1.1 200 ")
    finally:
        s.close()


def test_kept_alive_requests_are_served(served):
    s = served.connect()
    for _ in range(3):
        s.sendall(get("/v1/run"))
        head = s.recv(65536)
        assert head.startswith(b"HTTP/1.1 200 "), head[:80]
        time.sleep(0.3)  # within the idle timeout, and the head timer is not running
    t0 = time.monotonic()
    while s.recv(65536):  # the rest of the last answer, then the idle close
        pass
    assert time.monotonic() - t0 < 3.0


def test_connections_per_client_and_in_all_are_capped(served):
    held = [served.connect("127.0.0.2") for _ in range(3)]
    extra = served.connect("127.0.0.2")
    assert answer(extra).startswith(b"HTTP/1.1 429 ")
    other = served.connect("127.0.0.3")  # another client is still served
    other.sendall(get("/v1/run"))
    assert other.recv(65536).startswith(b"HTTP/1.1 200 ")
    held += [other, *(served.connect("127.0.0.4") for _ in range(2))]  # 6 in all
    late = served.connect("127.0.0.5")
    assert answer(late).startswith(b"HTTP/1.1 503 ")
    held[0].close()  # a closed connection frees its place
    time.sleep(0.2)
    again = served.connect("127.0.0.2")
    again.sendall(get("/v1/run"))
    assert again.recv(65536).startswith(b"HTTP/1.1 200 ")
    for s in held + [again]:
        s.close()
    deadline = time.monotonic() + 5
    while served.tally.total and time.monotonic() < deadline:
        time.sleep(0.05)
    assert served.tally.total == 0 and not served.tally.per_client


def test_an_answer_left_unread_is_cut_off(served):
    store = served.orch.svc.objects
    key = "big/blob.bin"
    path = store.root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\0" * (64 << 20))
    url = store.download_url(key, int(time.time()) + 60)
    target = url.split("//", 1)[1].split("/", 1)[1]
    s = served.connect(rcvbuf=4096)
    s.sendall(get("/" + target))
    time.sleep(3.0)  # never read: the server's sends stall
    got = 0
    try:
        while chunk := s.recv(1 << 20):
            got += len(chunk)
    except ConnectionResetError:
        pass
    assert got < (64 << 20), "the whole answer was sent to a client that did not read"


@pytest.mark.parametrize(
    "peer, client",
    [
        ("203.0.113.7", "203.0.113.7"),
        ("::ffff:203.0.113.7", "203.0.113.7"),
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:bbbb::9", "2001:db8:1:2::/64"),
        ("fe80::1%eth0", "fe80::/64"),
    ],
)
def test_clients_are_counted_by_address_or_ipv6_prefix(peer, client):
    assert client_of(peer) == client


def test_a_forwarded_for_header_does_not_move_the_caller_to_another_range(served):
    """uvicorn by default takes X-Forwarded-For from a loopback peer as the client's
    address: a local process could then claim any address range for its keys."""
    import json

    import httpx

    from swarmrl.protocol.signing import sign_request
    from tests.unit.orch_util import HW

    o = served.orch
    key = o.worker("w")
    body = json.dumps({"role": "worker", "hardware": HW}).encode()
    headers = sign_request(key, o.svc.run_id, "POST", "/v1/nodes/register", body, now=o.clock())
    headers |= {"content-type": "application/json", "x-forwarded-for": "203.0.113.5"}
    r = httpx.post(
        f"http://127.0.0.1:{served.port}/v1/nodes/register", content=body, headers=headers
    )
    assert r.status_code == 200, r.text
    net = o.svc.db.one("SELECT net FROM nodes WHERE key = ?", (public_key_hex(key),))
    assert net == [("127.0.0.1/32",)]


def test_a_body_held_up_on_the_clients_link_counts_in_latency_not_in_service(served):
    """A signed heartbeat whose body arrives 0.4 s after its headers (a worker's body
    queued behind its own file upload on a slow link): `swarmrl_request_seconds` holds
    the wait, `swarmrl_service_seconds` (the orchestrator's own time) does not."""
    import json

    from swarmrl.protocol.signing import sign_request

    o = served.orch
    key = o.worker("slow-link")
    o.register(key)
    o.open_step(0, 0)
    body = json.dumps({"policy_version": 0, "want_work": False}).encode()
    path = "/v1/nodes/heartbeat"
    signed = sign_request(key, o.svc.run_id, "POST", path, body, now=o.clock())
    head = f"POST {path} HTTP/1.1\r\nHost: o\r\nConnection: close\r\nContent-Type: application/json\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in signed.items())
    head += f"Content-Length: {len(body)}\r\n\r\n"
    s = served.connect()
    try:
        s.sendall(head.encode())
        time.sleep(0.4)
        s.sendall(body)
        reply = answer(s)
    finally:
        s.close()
    assert reply.startswith(b"HTTP/1.1 200 "), reply[:200]
    s = served.connect("127.0.0.3")
    try:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: o\r\nConnection: close\r\n\r\n")
        text = answer(s).decode()
    finally:
        s.close()

    def sums(name: str) -> tuple[float, float]:
        found = re.search(rf'^{name}_sum\{{route="{path}"\}} (\S+)$', text, re.M)
        count = re.search(rf'^{name}_count\{{route="{path}"\}} (\S+)$', text, re.M)
        assert found and count, f"no {name} for {path} in /metrics"
        return float(found[1]), float(count[1])

    latency, n = sums("swarmrl_request_seconds")
    service, m = sums("swarmrl_service_seconds")
    assert n == m == 1
    assert latency >= 0.4, latency
    assert service < 0.2, service  # the heartbeat itself: a few ms
