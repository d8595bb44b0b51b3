"""SHARDCAST flows in one process: origin thread, relays and clients on one event loop, loopback."""

from __future__ import annotations

import asyncio
import hashlib
import time

import pytest

from swarmrl.protocol.identity import load_or_create_key, public_key_hex
from swarmrl.protocol.manifest import MANIFEST, read_manifest, verify_version
from swarmrl.shardcast.client import Follower
from swarmrl.shardcast.local import LocalWeights
from swarmrl.shardcast.origin import Origin
from tests.unit.shardcast_util import (
    SHARD,
    make_origin,
    publish,
    serving,
    start_relays,
    until,
)


def test_relays_chain_and_clients_get_verified_versions(tmp_path, key):
    w, origin = make_origin(tmp_path, key)
    data0 = publish(w, 0)
    url = origin.start()
    pub = public_key_hex(key)

    async def main():
        stop = asyncio.Event()
        first = await start_relays([url], pub, tmp_path, stop, n=1)
        second = await start_relays(first, pub, tmp_path / "chained", stop, n=1)  # relay of a relay
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
        await until(lambda: len(got) == 3)
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
    w, origin = make_origin(tmp_path, key)
    data = publish(w, 0)
    url = origin.start()
    pub = public_key_hex(key)

    async def main():
        stop = asyncio.Event()
        bad, good = await start_relays([url], pub, tmp_path, stop, n=2)
        await until(
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
        await until(lambda: got)
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
        publish(w, 0)
    else:
        w = LocalWeights(tmp_path / "origin", key=key, shard_bytes=SHARD)
        publish(w, 0)
        m = read_manifest(w.path(0))
        m.files[0].sha256 = hashlib.sha256(b"evil").hexdigest()  # signature no longer matches
        (w.path(0) / MANIFEST).write_text(m.model_dump_json())
    origin = Origin(w)
    url = origin.start()

    async def main():
        stop = asyncio.Event()
        client = Follower([url], trusted, tmp_path / "client")
        task = asyncio.create_task(client.run(stop))
        await until(lambda: 0 in client.failed)
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
    w, origin = make_origin(tmp_path, key, keep=2, rate=4e6)
    size = 20 * SHARD
    publish(w, 0, size)
    url = origin.start()
    pub = public_key_hex(key)

    async def main():
        stop = asyncio.Event()
        relays = await start_relays([url], pub, tmp_path, stop, n=1)
        got = []
        client = Follower(relays, pub, tmp_path / "client", keep=2, on_fetched=got.append)
        task = asyncio.create_task(client.run(stop))
        await until(lambda: client.in_flight == 0)
        await asyncio.get_running_loop().run_in_executor(None, publish, w, 1, size)
        origin.sync()
        assert client.in_flight == 0  # still on version 0
        await until(lambda: [f.version for f in got] == [0, 1])
        await asyncio.get_running_loop().run_in_executor(None, publish, w, 2, size)
        origin.sync()
        await until(lambda: [f.version for f in got] == [0, 1, 2])
        relay_dir = LocalWeights(tmp_path / "relay-0")
        await until(lambda: relay_dir.versions() == [1, 2])  # dropped upstream: deleted
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
    w, origin = make_origin(tmp_path, key, rate=2e6)
    data = publish(w, 0, 16 * SHARD)  # ~0.5 s from the origin
    url = origin.start()
    pub = public_key_hex(key)

    async def main():
        import aiohttp

        stop = asyncio.Event()
        (relay,) = await start_relays([url], pub, tmp_path, stop, n=1)
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


def test_worker_source_deletes_a_damaged_copy_and_refetches_it(tmp_path, key):
    from swarmrl.shardcast.source import ShardcastWeights

    w, origin = make_origin(tmp_path, key)
    data = publish(w, 0)
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


def test_a_manifest_that_arrives_in_many_reads_is_read_whole(tmp_path, key):
    # 1600 shards: a ~180 KB manifest, more than one socket read
    pub = public_key_hex(key)
    w = LocalWeights(tmp_path / "origin", key=key, shard_bytes=256, trusted_key=pub)
    data = publish(w, 0, 1600 * 256)
    assert (w.path(0) / MANIFEST).stat().st_size > 150_000
    origin = Origin(w)
    url = origin.start()

    async def main():
        stop = asyncio.Event()
        got = []
        client = Follower([url], pub, tmp_path / "client", parallel=4, on_fetched=got.append)
        task = asyncio.create_task(client.run(stop))
        await until(lambda: got or client.failed, timeout=60)
        stop.set()
        await task
        return client

    try:
        client = asyncio.run(main())
    finally:
        origin.stop()
    assert not client.failed and client.pool.servers[url].bad_shards == 0
    assert (client.local.path(0) / "model.safetensors").read_bytes() == data


def test_nonsense_version_lists_are_ignored_and_polling_goes_on(tmp_path, key):
    from aiohttp import web

    w, origin = make_origin(tmp_path, key)
    publish(w, 0)
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
        async with serving([web.get("/versions", versions)]) as junk:
            stop = asyncio.Event()
            got = []
            client = Follower([junk, url], pub, tmp_path / "client", on_fetched=got.append)
            task = asyncio.create_task(client.run(stop))
            await until(lambda: got)
            await asyncio.sleep(4)  # three nonsense answers, one per second: it survives
            stop.set()
            await task
            return client, junk

    try:
        client, junk = asyncio.run(main())
    finally:
        origin.stop()
    assert client.local.versions() == [0]
    assert next(answers, "spent") == "spent"  # the junk server was asked again after each
    assert client.pool.servers[junk].versions == []


def test_a_server_back_from_a_failure_is_heard_at_once(tmp_path, key):
    """A relay killed and restarted with the version it had announced: its follower
    asks it for everything again rather than long-polling past that version, so the
    version counts as announced within a poll, not after poll_wait_s (30 s)."""
    from aiohttp import web

    asked: list[str] = []

    async def versions(request):
        asked.append(request.query["after"])
        if len(asked) == 2:  # killed: the connection breaks
            raise web.HTTPServiceUnavailable()
        if request.query["after"] != "-1":  # nothing newer: a long poll holds the answer
            await asyncio.sleep(float(request.query["wait"]))
        return web.json_response({"versions": [0]})

    async def main():
        async with serving([web.get("/versions", versions)]) as url:
            stop = asyncio.Event()
            client = Follower([url], public_key_hex(key), tmp_path / "client", poll_wait_s=30.0)
            task = asyncio.create_task(client.run(stop))
            try:
                await until(lambda: len(asked) >= 3, timeout=5)
                await until(lambda: client.pool.servers[url].versions == [0], timeout=3)
            finally:
                stop.set()
                await task

    asyncio.run(main())
    assert asked[:3] == ["-1", "0", "-1"]


def test_a_version_given_up_on_is_fetched_as_soon_as_a_server_announces_it_again(tmp_path, key):
    """A relay that announced a version and lost it (its upstream died mid-broadcast:
    every shard 404s) is given up on; once restarted with the version it announces it
    again, and the follower fetches it at once, not after FAILED_RETRY_S or its
    backoff."""
    import aiohttp
    from aiohttp import web

    from swarmrl.shardcast import client as client_mod

    w, origin = make_origin(tmp_path, key)
    data0 = publish(w, 0)
    origin_url = origin.start()
    state = {"up": False, "asked": 0}

    async def versions(request):
        state["asked"] += 1
        if state["asked"] > 1 and not state["up"]:  # dying, then down
            raise web.HTTPServiceUnavailable()
        if request.query["after"] != "-1":
            await asyncio.sleep(float(request.query["wait"]))
        return web.json_response({"versions": [0]})

    async def files(request):
        if request.path.endswith("manifest.json") or state["up"]:
            async with aiohttp.ClientSession() as session:
                async with session.get(origin_url + request.path_qs) as r:
                    return web.Response(body=await r.read(), status=r.status)
        raise web.HTTPNotFound()

    async def main():
        routes = [web.get("/versions", versions), web.get("/v/{tail:.*}", files)]
        async with serving(routes) as url:
            stop = asyncio.Event()
            got = []
            client = Follower([url], public_key_hex(key), tmp_path / "client",
                              poll_wait_s=30.0, on_fetched=got.append)  # fmt: skip
            task = asyncio.create_task(client.run(stop))
            try:
                await until(lambda: 0 in client.failed, timeout=10)  # no server left has it
                state["up"] = True  # restarted with the version
                t0 = time.monotonic()
                await until(lambda: got, timeout=client_mod.FAILED_RETRY_S)
                return client, time.monotonic() - t0
            finally:
                stop.set()
                await task

    try:
        client, waited = asyncio.run(main())
    finally:
        origin.stop()
    assert waited < client_mod.FAILED_RETRY_S / 2
    assert (client.local.path(0) / "model.safetensors").read_bytes() == data0


def test_the_server_list_is_followed_as_the_orchestrator_changes_it(tmp_path, key):
    """A node that joined when only a dead server was advertised fetches once the
    refreshed list names a live one; a failed refresh keeps the list; a server
    taken off the list is no longer polled or picked."""
    w, origin = make_origin(tmp_path, key)
    data0 = publish(w, 0)
    url = origin.start()
    pub = public_key_hex(key)
    dead = "http://127.0.0.1:9"  # the discard port: nothing listens
    lists = iter([RuntimeError("orchestrator restarting"), [dead, url], [url]])
    asked = []

    def servers_from():
        asked.append(time.monotonic())
        answer = next(lists, [url])
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def main():
        stop = asyncio.Event()
        got = []
        client = Follower(
            [dead], pub, tmp_path / "client", on_fetched=got.append,
            servers_from=servers_from, refresh_s=0.2,
        )  # fmt: skip
        task = asyncio.create_task(client.run(stop))
        await until(lambda: got)
        await until(lambda: len(asked) >= 4)
        stop.set()
        await task
        return client, got

    try:
        client, got = asyncio.run(main())
    finally:
        origin.stop()
    assert got[0].version == 0
    assert (client.local.path(0) / "model.safetensors").read_bytes() == data0
    assert client.pool.servers[dead].withdrawn and client.pool.servers[dead].versions == []
    assert not client.pool.servers[url].withdrawn
    assert len(asked) >= 4  # the failure did not end the refreshing
