"""SHARDCAST in one process: origin thread, relays and clients on one event loop, loopback."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import stat
import time
from pathlib import Path

import pytest

from swarmrl.protocol.identity import load_or_create_key, public_key_hex
from swarmrl.shardcast.client import Follower
from swarmrl.shardcast.local import LocalWeights
from swarmrl.shardcast.manifest import MANIFEST, ManifestError, read_manifest, verify_version
from swarmrl.shardcast.origin import Origin
from swarmrl.shardcast.relay import serve_relay

SHARD = 64 * 1024


@pytest.fixture
def key(tmp_path):
    return load_or_create_key(tmp_path / "keys" / "trainer.key")


def _publish(w: LocalWeights, v: int, size: int = 5 * SHARD + 123) -> bytes:
    data = os.urandom(size)
    d = w.staging_dir(v)
    (d / "model.safetensors").write_bytes(data)
    (d / "config.json").write_text(json.dumps({"v": v}))
    w.publish(v)
    return data


def _origin(tmp_path, key, keep=3, rate=0.0) -> tuple[LocalWeights, Origin]:
    pub = public_key_hex(key)
    w = LocalWeights(tmp_path / "origin", keep=keep, key=key, shard_bytes=SHARD, trusted_key=pub)
    return w, Origin(w, max_bytes_per_s=rate)


async def _relays(urls, pub, tmp_path, stop, n=2, **kw) -> list[str]:
    ports: list[int] = []
    for i in range(n):
        asyncio.create_task(
            serve_relay(urls, pub, tmp_path / f"relay-{i}", stop=stop, on_ready=ports.append, **kw)
        )
    while len(ports) < n:
        await asyncio.sleep(0.01)
    return [f"http://127.0.0.1:{p}" for p in ports]


async def _until(cond, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


def test_key_file_is_private_and_reloads(tmp_path, key):
    path = tmp_path / "keys" / "trainer.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert public_key_hex(load_or_create_key(path)) == public_key_hex(key)
    assert (tmp_path / "keys" / "trainer.pub").read_text().strip() == public_key_hex(key)


def test_manifest_signature_checks(tmp_path, key):
    w, _ = _origin(tmp_path, key)
    _publish(w, 0)
    pub = public_key_hex(key)
    m = verify_version(w.path(0), pub)
    other = public_key_hex(load_or_create_key(tmp_path / "other.key"))
    with pytest.raises(ManifestError, match="not by the trusted"):
        m.check_signature(other)
    with pytest.raises(ManifestError, match="bad signature"):
        m.model_copy(update={"version": 7}).check_signature(pub)  # replayed as another version
    tampered = m.model_copy(deep=True)
    tampered.files[0].shards[0].sha256 = "0" * 64
    with pytest.raises(ManifestError, match="bad signature"):
        tampered.check_signature(pub)
    with pytest.raises(ManifestError, match="not signed"):
        m.model_copy(update={"signature": "", "signer": ""}).check_signature(pub)


def test_relays_chain_and_clients_get_verified_versions(tmp_path, key):
    w, origin = _origin(tmp_path, key)
    data0 = _publish(w, 0)
    url = origin.start()
    pub = public_key_hex(key)

    async def main():
        stop = asyncio.Event()
        first = await _relays([url], pub, tmp_path, stop, n=1)
        second = await _relays(first, pub, tmp_path / "chained", stop, n=1)  # relay of a relay
        got = []
        clients = [
            Follower(
                second + first,
                pub,
                tmp_path / f"client-{i}",
                on_fetched=got.append,
                direct_io=i % 2 == 0,  # both ways of writing the file
            )
            for i in range(3)
        ]
        tasks = [asyncio.create_task(c.run(stop)) for c in clients]
        await _until(lambda: len(got) == 3)
        stop.set()
        await asyncio.gather(*tasks)
        return clients, got

    try:
        clients, got = asyncio.run(main())
    finally:
        origin.stop()
    for c in clients:
        d = verify_version(c.local.path(0), pub)
        assert (c.local.path(0) / "model.safetensors").read_bytes() == data0
        assert d.version == 0
    assert all(f.latency_s >= 0 and f.bytes == len(data0) + len('{"v": 0}') for f in got)


def test_corrupt_relay_is_detected_marked_and_avoided(tmp_path, key):
    w, origin = _origin(tmp_path, key)
    data = _publish(w, 0)
    url = origin.start()
    pub = public_key_hex(key)

    async def main():
        stop = asyncio.Event()
        bad, good = await _relays([url], pub, tmp_path, stop, n=2)
        await _until(
            lambda: all((tmp_path / f"relay-{i}/step_000000/{MANIFEST}").exists() for i in (0, 1))
        )
        # relay-0 flips a byte in every shard of the model file it serves
        path = tmp_path / "relay-0/step_000000/model.safetensors"
        blob = bytearray(path.read_bytes())
        for off in range(0, len(blob), SHARD):
            blob[off] ^= 0xFF
        path.write_bytes(bytes(blob))
        got, reports = [], []
        client = Follower(
            [bad, good],
            pub,
            tmp_path / "client",
            on_fetched=got.append,
            on_bad_data=lambda url, what: reports.append(url),
        )
        task = asyncio.create_task(client.run(stop))
        await _until(lambda: got)
        stop.set()
        await task
        return client, bad, good, reports

    try:
        client, bad, good, reports = asyncio.run(main())
    finally:
        origin.stop()
    assert (client.local.path(0) / "model.safetensors").read_bytes() == data
    verify_version(client.local.path(0), pub)
    assert client.pool.servers[bad].bad_shards >= 1
    assert client.pool.servers[good].bad_shards == 0
    assert client.pool.servers[bad].ema_ok < client.pool.servers[good].ema_ok
    assert reports and set(reports) == {bad}  # reported, and only the guilty server


@pytest.mark.parametrize("forgery", ["other_key", "tampered"])
def test_forged_manifest_is_rejected_and_nothing_installed(tmp_path, key, forgery):
    trusted = public_key_hex(key)
    if forgery == "other_key":
        signer = load_or_create_key(tmp_path / "impostor.key")
        w = LocalWeights(tmp_path / "origin", key=signer, shard_bytes=SHARD)
        _publish(w, 0)
    else:
        w = LocalWeights(tmp_path / "origin", key=key, shard_bytes=SHARD)
        _publish(w, 0)
        m = read_manifest(w.path(0))
        m.files[0].sha256 = hashlib.sha256(b"evil").hexdigest()  # signature no longer matches
        (w.path(0) / MANIFEST).write_text(m.model_dump_json())
    origin = Origin(w)
    url = origin.start()

    async def main():
        stop = asyncio.Event()
        client = Follower([url], trusted, tmp_path / "client")
        task = asyncio.create_task(client.run(stop))
        await _until(lambda: 0 in client.failed)
        stop.set()
        await task
        return client

    try:
        client = asyncio.run(main())
    finally:
        origin.stop()
    assert client.local.versions() == []
    assert not any((tmp_path / "client").iterdir())  # nothing installed, not even a staging dir
    assert client.pool.servers[url].bad_shards == 1  # the server that sent it is marked


def test_new_version_during_download_and_retention(tmp_path, key):
    # The origin sends 4 MB/s, so a 5-shard version takes ~0.1 s per client and
    # version 1 is published while version 0 is still in flight.
    w, origin = _origin(tmp_path, key, keep=2, rate=4e6)
    size = 20 * SHARD
    _publish(w, 0, size)
    url = origin.start()
    pub = public_key_hex(key)

    async def main():
        stop = asyncio.Event()
        relays = await _relays([url], pub, tmp_path, stop, n=1)
        got = []
        client = Follower(relays, pub, tmp_path / "client", keep=2, on_fetched=got.append)
        task = asyncio.create_task(client.run(stop))
        await _until(lambda: client.in_flight == 0)
        await asyncio.get_running_loop().run_in_executor(None, _publish, w, 1, size)
        origin.sync()
        assert client.in_flight == 0  # still on version 0
        await _until(lambda: [f.version for f in got] == [0, 1])
        await asyncio.get_running_loop().run_in_executor(None, _publish, w, 2, size)
        origin.sync()
        await _until(lambda: [f.version for f in got] == [0, 1, 2])
        relay_dir = LocalWeights(tmp_path / "relay-0")
        await _until(lambda: relay_dir.versions() == [1, 2])  # dropped upstream: deleted
        stop.set()
        await task
        return client

    try:
        client = asyncio.run(main())
    finally:
        origin.stop()
    assert w.versions() == [1, 2]
    assert client.local.versions() == [1, 2]
    for v in (1, 2):
        verify_version(client.local.path(v), pub)


def test_relay_announces_and_streams_before_it_has_the_shards(tmp_path, key):
    w, origin = _origin(tmp_path, key, rate=2e6)
    data = _publish(w, 0, 16 * SHARD)  # ~0.5 s from the origin
    url = origin.start()
    pub = public_key_hex(key)

    async def main():
        import aiohttp

        stop = asyncio.Event()
        (relay,) = await _relays([url], pub, tmp_path, stop, n=1)
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{relay}/versions?after=-1&wait=10") as r:
                assert (await r.json())["versions"] == [0]
            complete_when_announced = (tmp_path / f"relay-0/step_000000/{MANIFEST}").exists()
            # the last shard is not there yet: this request waits and streams it
            async with s.get(f"{relay}/v/0/model.safetensors/15") as r:
                assert r.status == 200
                body = await r.read()
        stop.set()
        return complete_when_announced, body

    try:
        complete_when_announced, body = asyncio.run(main())
    finally:
        origin.stop()
    assert not complete_when_announced
    assert body == data[15 * SHARD :]


def test_server_rejects_traversal_and_malformed_requests(tmp_path, key):
    w, origin = _origin(tmp_path, key)
    data = _publish(w, 0)
    (tmp_path / "secret.txt").write_text("secret")
    url = origin.start()
    port = origin.port

    async def raw(request: bytes) -> tuple[int, bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        await writer.drain()
        response = b""
        while True:  # until the server closes, or 3 s of silence (a kept-alive connection)
            try:
                chunk = await asyncio.wait_for(reader.read(65536), 3.0)
            except TimeoutError:
                break
            if not chunk:
                break
            response += chunk
        writer.close()
        status = int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/") else 0
        return status, response

    def get(path: str, extra: str = "") -> bytes:
        return f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{extra}\r\n".encode()

    async def main():
        out = {}
        for name, req in {
            "dotdot": get("/v/0/../../../secret.txt"),
            "dotdot_encoded": get("/v/0/%2e%2e%2fsecret.txt/0"),
            "slash_encoded": get("/v/0/..%2F..%2Fsecret.txt/0"),
            "hidden_name": get("/v/0/.manifest.json/0"),
            "manifest_as_file": get("/v/0/manifest.json/0"),
            "bad_version": get("/v/abc/manifest.json"),
            "unicode_digit": get("/v/%C2%B2/manifest.json"),
            "huge_version": get("/v/99999999999999999999/manifest.json"),
            "unknown_version": get("/v/42/manifest.json"),
            "bad_index": get("/v/0/model.safetensors/-1"),
            "index_past_end": get("/v/0/model.safetensors/999"),
            "bad_after": get("/versions?after=abc"),
            "bad_range": get("/v/0/model.safetensors/0", "Range: bytes=zz\r\n"),
            "range_past_end": get("/v/0/model.safetensors/0", f"Range: bytes={SHARD}-\r\n"),
            "garbage": b"\x00\x01\x02 NOT HTTP\r\n\r\n",
            "post": b"POST /versions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        }.items():
            out[name] = (await raw(req))[0]
        status, resp = await raw(get("/v/0/model.safetensors/1", "Range: bytes=10-19\r\n"))
        return out, status, resp.split(b"\r\n\r\n", 1)[1]

    try:
        statuses, range_status, range_body = asyncio.run(main())
        import urllib.request

        health = json.loads(urllib.request.urlopen(url + "/health").read())
    finally:
        origin.stop()
    assert all(400 <= s < 500 for s in statuses.values()), statuses
    assert statuses["unknown_version"] == 404 and statuses["range_past_end"] == 416
    assert range_status == 206 and range_body == data[SHARD + 10 : SHARD + 20]
    assert health["versions"] == [0]  # still serving after all of that


def test_oversized_manifest_is_rejected(tmp_path, key):
    from swarmrl.shardcast.manifest import MAX_MANIFEST_BYTES, parse_manifest

    with pytest.raises(ManifestError, match="larger than"):
        parse_manifest(b" " * (MAX_MANIFEST_BYTES + 1))
    with pytest.raises(ManifestError, match="malformed"):
        parse_manifest(b'{"version": 0, "files": "x"}')
    bad_tiling = {
        "version": 0,
        "created": 0.0,
        "files": [
            {
                "name": "a",
                "size": 10,
                "sha256": "0" * 64,
                "shards": [{"offset": 0, "size": 4, "sha256": "0" * 64}],
            }
        ],
    }
    with pytest.raises(ManifestError, match="add up"):
        parse_manifest(json.dumps(bad_tiling).encode())


def test_publisher_does_not_block_and_reports_errors(tmp_path, key):
    from swarmrl.shardcast.origin import Publisher

    w, _ = _origin(tmp_path, key)
    pub = Publisher(w)
    done = []

    def slow_write(d: Path) -> None:
        time.sleep(0.5)
        (d / "model.safetensors").write_bytes(b"x" * 100)

    t0 = time.monotonic()
    pub.submit(0, slow_write, then=lambda: done.append(0))
    assert time.monotonic() - t0 < 0.2 and not done
    pub.flush()
    assert done == [0] and w.versions() == [0]

    def broken(d: Path) -> None:
        raise OSError("disk full")

    def slow_broken(d: Path) -> None:
        time.sleep(0.3)
        raise OSError("disk full")

    pub.submit(1, slow_broken)
    pub.submit(2, slow_write, then=lambda: done.append(2))  # queued behind the failure
    with pytest.raises(OSError, match="disk full"):
        pub.flush()
    assert w.versions() == [0] and done == [0]  # nothing published past the failed version
    pub.close()


def test_worker_source_deletes_a_damaged_copy_and_refetches_it(tmp_path, key):
    from swarmrl.shardcast.source import ShardcastWeights

    w, origin = _origin(tmp_path, key)
    data = _publish(w, 0)
    url = origin.start()
    pub = public_key_hex(key)
    source = ShardcastWeights(Follower([url], pub, tmp_path / "node")).start()
    try:
        deadline = time.monotonic() + 20
        while source.newest() != 0:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        path = source.open_verified(0) / "model.safetensors"
        path.write_bytes(b"\0" * len(data))  # torn by a crash
        with pytest.raises(FileNotFoundError, match="damaged"):
            source.open_verified(0)
        while source.newest() != 0:
            assert time.monotonic() < deadline, "the damaged version was not fetched again"
            time.sleep(0.02)
        assert (source.open_verified(0) / "model.safetensors").read_bytes() == data
    finally:
        source.stop()
        origin.stop()


@pytest.mark.parametrize(
    "reply, error",
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nabcd", None),
        (b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n", "HTTP 404"),
        (b"HTTP/1.1 200 OK\r\n\r\nabcd", "Content-Length None"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n\r\n", "chunked"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabcd", "Content-Length 9, expected 4"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nab", "body missing"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nabcdEXTRA", "more bytes"),
        (b"garbage\r\n\r\n", "malformed status"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"y" * 20000, "larger than 16 KB"),
    ],
)
def test_fastget_takes_only_the_expected_body(reply, error):
    from swarmrl.shardcast.fastget import FastGet, HttpError

    async def main():
        async def serve(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(reply)
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        got = bytearray()
        fg = FastGet(idle_timeout_s=5)
        try:
            await fg.get(f"http://127.0.0.1:{port}/x", {}, 200, 4, lambda b: got.extend(b))
            return bytes(got), None
        except HttpError as e:
            return bytes(got), str(e)
        finally:
            fg.close()
            server.close()

    body, got_error = asyncio.run(main())
    if error is None:
        assert got_error is None and body == b"abcd"
    else:
        assert got_error is not None and error in got_error


@pytest.mark.parametrize("direct", [False, True])
def test_shard_writer_puts_every_byte_in_place(tmp_path, direct):
    import random

    from swarmrl.shardcast.writer import ShardWriter, open_direct

    rng = random.Random(0)
    data = os.urandom(3 * (1 << 20) + 12345)
    bounds = [0, 777, 5000, 1 << 20, 2 * (1 << 20) + 3, len(data)]  # unaligned shards
    path = tmp_path / "f.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    os.ftruncate(fd, len(data))
    dfd = open_direct(path) if direct else None
    if direct:
        assert dfd is not None  # this machine's filesystem does O_DIRECT
    order = list(range(len(bounds) - 1))
    rng.shuffle(order)  # shards land in any order; bytes within a shard in order
    for i in order:
        w = ShardWriter(fd, dfd, bounds[i], bounds[i + 1] - bounds[i])
        pos = bounds[i]
        while pos < bounds[i + 1]:
            n = min(rng.choice([1, 100, 4096, 65536, 300000]), bounds[i + 1] - pos)
            w.write(data[pos : pos + n])
            pos += n
        w.close()
    os.close(fd)
    if dfd is not None:
        os.close(dfd)
    assert path.read_bytes() == data


def test_a_manifest_that_arrives_in_many_reads_is_read_whole(tmp_path, key):
    # 1600 shards: a ~180 KB manifest, more than one socket read
    pub = public_key_hex(key)
    w = LocalWeights(tmp_path / "origin", key=key, shard_bytes=256, trusted_key=pub)
    data = _publish(w, 0, 1600 * 256)
    assert (w.path(0) / MANIFEST).stat().st_size > 150_000
    origin = Origin(w)
    url = origin.start()

    async def main():
        stop = asyncio.Event()
        got = []
        client = Follower([url], pub, tmp_path / "client", parallel=4, on_fetched=got.append)
        task = asyncio.create_task(client.run(stop))
        await _until(lambda: got or client.failed, timeout=60)
        stop.set()
        await task
        return client

    try:
        client = asyncio.run(main())
    finally:
        origin.stop()
    assert not client.failed and client.pool.servers[url].bad_shards == 0
    assert (client.local.path(0) / "model.safetensors").read_bytes() == data


def test_dropping_a_version_ends_its_in_flight_bodies_at_once(tmp_path, key):
    import aiohttp

    from swarmrl.shardcast.server import ServedVersion, ShardServer, VersionTable

    w, _ = _origin(tmp_path, key)
    _publish(w, 0)
    manifest = read_manifest(w.path(0))

    async def main():
        table = VersionTable()
        # announced, nothing on disk yet: a request for shard 0 waits for bytes
        table.announce(ServedVersion(manifest, b"{}", w.path(0), complete=False))
        server = ShardServer(table, "relay")
        port = await server.start("127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession() as s:
                async with s.get(f"http://127.0.0.1:{port}/v/0/model.safetensors/0") as r:
                    assert r.status == 200
                    asyncio.get_running_loop().call_later(0.2, table.drop, 0)
                    # without closing, the client would sit on a kept-alive socket
                    # until its own read timeout; 10 s here is only a guard
                    with pytest.raises(aiohttp.ClientPayloadError):
                        await asyncio.wait_for(r.read(), 10)
        finally:
            await server.stop()

    asyncio.run(main())


def test_server_choice_by_throughput_success_and_backoff():
    from swarmrl.shardcast.servers import ServerPool

    async def main():
        pool = ServerPool(["http://a", "http://b"])
        a, b = pool.servers["http://a"], pool.servers["http://b"]
        a.versions = b.versions = [3]
        pool.success(b, 10_000_000, 1.0)  # b measured at 10 MB/s
        assert pool.pick(3, set()) is a  # a not measured yet: tried first
        pool.failure(a, "connection refused")
        assert pool.pick(3, set()) is b and a.backoff_until > 0  # a backs off
        a.backoff_until = 0.0  # backoff over
        assert pool.pick(3, set()) is a  # failed before any measurement: explored again
        pool.success(a, 1_000_000, 1.0)  # a measured at 1 MB/s
        assert pool.pick(3, set()) is b  # the faster server wins
        b.active = 20  # ...unless it is already busy with many transfers
        assert pool.pick(3, set()) is a
        assert pool.pick(3, {"http://a"}) is b and pool.pick(4, set()) is None

    asyncio.run(main())


def test_nonsense_version_lists_are_ignored_and_polling_goes_on(tmp_path, key):
    from aiohttp import web

    w, origin = _origin(tmp_path, key)
    _publish(w, 0)
    url = origin.start()
    pub = public_key_hex(key)
    answers = iter([b"[1, 2]", b'{"versions": "x"}', b"{" + b" " * 100_000 + b"}"])

    async def versions(request):
        body = next(answers, None)
        if body is None:  # then it behaves: an honest-looking empty list
            await asyncio.sleep(0.5)
            return web.json_response({"versions": []})
        return web.Response(body=body, content_type="application/json")

    async def main():
        app = web.Application()
        app.add_routes([web.get("/versions", versions)])
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        junk = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        stop = asyncio.Event()
        got = []
        client = Follower([junk, url], pub, tmp_path / "client", on_fetched=got.append)
        task = asyncio.create_task(client.run(stop))
        await _until(lambda: got)
        await asyncio.sleep(4)  # three nonsense answers, one per second: the poll survives
        stop.set()
        await task
        await runner.cleanup()
        return client, junk

    try:
        client, junk = asyncio.run(main())
    finally:
        origin.stop()
    assert client.local.versions() == [0]
    assert next(answers, "spent") == "spent"  # the junk server was asked again after each
    assert client.pool.servers[junk].versions == []
