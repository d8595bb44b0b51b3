"""A hostile relay (sim/hostile_relay.py) beside an honest origin, on loopback: a
follower gets every genuine version within a bound set by its deadlines, keeps every
genuine version it holds, and marks the liar.

The deadlines are scaled down (2 s of grace, then 4 MiB/s) so that each test takes
seconds; the bound is derived from them as it would be from the defaults (14 s per
manifest, 10.25 s per 64 KiB shard)."""

from __future__ import annotations

import asyncio
import shutil
import socket
import time

import pytest

from swarmrl.protocol.identity import public_key_hex
from swarmrl.protocol.manifest import MAX_MANIFEST_BYTES, read_manifest, verify_version
from swarmrl.shardcast import announce, client
from swarmrl.shardcast.client import Follower
from swarmrl.shardcast.origin import Origin
from swarmrl.sim.hostile_relay import HostileRelay
from tests.unit.shardcast_util import SHARD, make_origin, publish, until

SLACK_S = 3.0  # wake-ups and a loaded machine


@pytest.fixture(autouse=True)
def quick_deadlines(monkeypatch):
    monkeypatch.setattr(client, "GRACE_S", 2.0)
    monkeypatch.setattr(client, "MIN_BPS", 4 << 20)


def version_bound_s() -> float:
    """The longest a genuine version may take once an honest server announces it: the
    follower may be asking the liar for a fake version's manifest, then ask it for this
    version's manifest, then for its shards (all at once), each to its deadline."""
    return 2 * client.deadline_s(MAX_MANIFEST_BYTES) + client.deadline_s(SHARD) + SLACK_S


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_follower_gets_each_version_in_bounded_time_past_a_trickling_liar(tmp_path, key):
    """The liar trickles everything (4 bytes a second) and announces a new fake version
    in every answer: under the old client its first fake manifest held the follower for
    aiohttp's 300 s, and fresh fakes kept it from the real versions after that."""
    w, origin = make_origin(tmp_path, key, keep=8)
    data = {0: publish(w, 0)}
    origin_url = origin.start()
    pub = public_key_hex(key)

    async def main():
        liar = HostileRelay(w.root, bps=4.0)  # it serves the origin's own versions
        liar_url = await liar.start()
        stop = asyncio.Event()
        got, reports = [], []
        node = Follower([liar_url, origin_url], pub, tmp_path / "node", keep=8,
                        poll_wait_s=2.0, on_fetched=got.append,
                        on_bad_data=lambda url, what: reports.append(url))  # fmt: skip
        task = asyncio.create_task(node.run(stop))
        try:
            for v in (1, 2, 3):
                await until(lambda v=v: len(got) == v, timeout=version_bound_s())
                assert node.local.versions() == list(range(v))  # nothing deleted
                await asyncio.sleep(1.0)
                data[v] = await asyncio.to_thread(publish, w, v)
                origin.sync()
            await until(lambda: len(got) == 4, timeout=version_bound_s())
        finally:
            stop.set()
            await task
            await liar.stop()
        return node, got, reports, liar, liar_url

    try:
        node, got, reports, liar, liar_url = asyncio.run(main())
    finally:
        origin.stop()
    assert [f.version for f in got] == [0, 1, 2, 3]
    assert max(f.latency_s for f in got) < version_bound_s()  # from publish to held
    assert node.local.versions() == [0, 1, 2, 3]  # every genuine version kept
    for v, blob in data.items():
        assert verify_version(node.local.path(v), pub).version == v
        assert (node.local.path(v) / "model.safetensors").read_bytes() == blob
    liar_stats, honest = node.pool.servers[liar_url], node.pool.servers[origin_url]
    assert liar_stats.failures >= 1 and liar_stats.broke_promise  # marked, backed off
    assert honest.bad_shards == 0 and not honest.broke_promise and origin_url not in reports
    assert any(v > 3 for v in node.failed)  # it did ask about fake versions
    manifests = [s for path, s in liar.held if path.endswith(".json")]
    shards = [s for path, s in liar.held if not path.endswith(".json")]
    assert manifests  # no request outlived its deadline (plus a tick of the liar's)
    assert max(manifests) < client.deadline_s(MAX_MANIFEST_BYTES) + 1.0
    assert max(shards, default=0.0) < client.deadline_s(SHARD) + 1.0


def test_a_relay_deletes_nothing_on_a_liars_word_and_still_follows_its_origin(tmp_path, key):
    """A relay restarted with versions 0-2 while its origin is down hears only the liar,
    which announces 2, 3 (not published yet) and one far beyond, whose manifest it
    replays from version 0 at full speed. The old client deleted 0 and 1 (older than
    everything announced); this one keeps them, reports the replay as bad data, and
    once the origin is back follows it, version 3 and the origin's drop of 0 too."""
    w, _ = make_origin(tmp_path, key, keep=3)
    data = {v: publish(w, v) for v in range(3)}
    relay_dir = tmp_path / "relay"
    for v in range(3):
        shutil.copytree(w.path(v), relay_dir / w.path(v).name)
    port = _free_port()
    origin = Origin(w, port=port)
    origin_url = f"http://127.0.0.1:{port}"
    pub = public_key_hex(key)

    async def main():
        liar = HostileRelay(w.root, bps=1e6)
        liar_url = await liar.start()
        stop = asyncio.Event()
        got, reports = [], []
        relay = Follower([origin_url, liar_url], pub, relay_dir, keep=8, follow_drops=True,
                         poll_wait_s=2.0, on_fetched=got.append,
                         on_bad_data=lambda url, what: reports.append(url))  # fmt: skip
        task = asyncio.create_task(relay.run(stop))
        try:
            await until(lambda: reports, timeout=version_bound_s())  # the replay caught
            await asyncio.sleep(2.0)  # its loop goes round, hearing only the liar
            assert relay.local.versions() == [0, 1, 2]  # the old client kept only 2
            origin.start()
            data[3] = await asyncio.to_thread(publish, w, 3)  # the origin drops 0
            origin.sync()
            t0 = time.monotonic()
            await until(lambda: 3 in relay.local.versions(),
                        timeout=announce.POLL_RETRY_S + version_bound_s())  # fmt: skip
            waited = time.monotonic() - t0
            await until(lambda: relay.local.versions() == [1, 2, 3], timeout=5)
        finally:
            stop.set()
            await task
            await liar.stop()
        return relay, waited, reports, liar_url

    try:
        relay, waited, reports, liar_url = asyncio.run(main())
    finally:
        origin.stop()
    assert waited < announce.POLL_RETRY_S + version_bound_s()
    assert set(reports) == {liar_url} and relay.pool.servers[liar_url].bad_shards >= 1
    for v in (1, 2, 3):
        assert read_manifest(relay.local.path(v)).version == v
        assert (relay.local.path(v) / "model.safetensors").read_bytes() == data[v]
