"""SHARDCAST parts on their own: keys and signatures, the HTTP server, the shard GET, the writer, the publisher, server choice."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import time
from pathlib import Path

import pytest

from swarmrl.protocol.identity import load_or_create_key, public_key_hex
from swarmrl.protocol.manifest import ManifestError, read_manifest, verify_version
from tests.unit.shardcast_util import (
    SHARD,
    make_origin,
    publish,
)


def test_key_file_is_private_and_reloads(tmp_path, key):
    path = tmp_path / "keys" / "trainer.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert public_key_hex(load_or_create_key(path)) == public_key_hex(key)
    assert (tmp_path / "keys" / "trainer.pub").read_text().strip() == public_key_hex(key)


def test_manifest_signature_checks(tmp_path, key):
    w, _ = make_origin(tmp_path, key)
    publish(w, 0)
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


def test_server_rejects_traversal_and_malformed_requests(tmp_path, key):
    w, origin = make_origin(tmp_path, key)
    data = publish(w, 0)
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
    from swarmrl.protocol.manifest import MAX_MANIFEST_BYTES, parse_manifest

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

    w, _ = make_origin(tmp_path, key)
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

    # the trainer, waiting for rollouts, learns of a failed publish without publishing again
    later = Publisher(w)
    later.submit(3, broken)
    deadline = time.monotonic() + 10
    with pytest.raises(OSError, match="disk full"):
        while time.monotonic() < deadline:
            assert later.raise_failures() is False
            time.sleep(0.01)
    later.close()


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


def test_dropping_a_version_ends_its_in_flight_bodies_at_once(tmp_path, key):
    import aiohttp

    from swarmrl.shardcast.server import ServedVersion, ShardServer, VersionTable

    w, _ = make_origin(tmp_path, key)
    publish(w, 0)
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
