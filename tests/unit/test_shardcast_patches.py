"""SHARDCAST with weight patches, on loopback: nodes that hold the base take the patch,
a node behind walks the chain, a bad patch is caught and its server reported, and a
relay restarted in the middle of a chain serves the rest."""

from __future__ import annotations

import asyncio
import shutil

import numpy as np

from swarmrl.protocol.identity import public_key_hex
from swarmrl.protocol.manifest import read_manifest, verify_version
from swarmrl.shardcast.client import Follower
from swarmrl.shardcast.local import LocalWeights
from swarmrl.shardcast.origin import Origin
from swarmrl.shardcast.relay import serve_relay
from tests.unit.shardcast_util import SHARD, start_relays, until

N = 400_000  # bfloat16 elements: 800 kB, 13 shards


class Versions:
    """An origin publishing bfloat16-like versions, each moving 1% of the elements by an
    ulp or two (as an RL step does), with patches on."""

    def __init__(self, tmp_path, key, keep=5):
        self.rng = np.random.default_rng(0)
        self.w = self.rng.integers(0x3C00, 0x3F80, size=N, dtype=np.uint16)
        self.weights = LocalWeights(
            tmp_path / "origin", keep=keep, key=key, shard_bytes=SHARD,
            trusted_key=public_key_hex(key), patch_max_fraction=0.5,
        )  # fmt: skip
        self.data: dict[int, bytes] = {}
        self.origin = Origin(self.weights)

    def publish(self, v: int) -> None:
        if v:
            idx = self.rng.choice(N, size=N // 100, replace=False)
            self.w[idx] += self.rng.integers(1, 3, size=idx.size).astype(np.uint16)
        d = self.weights.staging_dir(v)
        self.data[v] = self.w.tobytes()
        (d / "model.safetensors").write_bytes(self.data[v])
        (d / "config.json").write_text('{"dtype": "bfloat16"}')
        self.weights.publish(v)
        if self.origin.loop is not None:  # started: it announces the new version
            self.origin.sync()

    def seed(self, root, v: int) -> None:
        """A node that already holds version `v` (as fetched earlier)."""
        shutil.copytree(self.weights.path(v), root / self.weights.path(v).name)
        for p in (root / self.weights.path(v).name).glob("*.patch"):
            p.unlink()


def _run(origin, coro):
    try:
        return asyncio.run(coro)
    finally:
        origin.stop()


def test_a_node_three_versions_behind_walks_the_chain_of_patches(tmp_path, key):
    src = Versions(tmp_path, key)
    for v in range(4):
        src.publish(v)
    origin = src.origin
    url, pub = origin.start(), public_key_hex(key)
    src.seed(tmp_path / "client", 0)

    async def main():
        stop, got = asyncio.Event(), []
        client = Follower([url], pub, tmp_path / "client", keep=2, on_fetched=got.append)
        task = asyncio.create_task(client.run(stop))
        await until(lambda: got and got[-1].version == 3)
        stop.set()
        await task
        return client, got

    client, got = _run(origin, main())
    assert [(f.version, f.patched_from) for f in got] == [(1, 0), (2, 1), (3, 2)]
    full = got[-1].full_bytes
    assert sum(f.bytes for f in got) < full / 3, [f.bytes for f in got]
    verify_version(client.local.path(3), pub)
    assert (client.local.path(3) / "model.safetensors").read_bytes() == src.data[3]
    assert client.local.versions() == [2, 3]


def test_a_forged_patch_is_caught_its_relay_reported_and_the_patch_taken_elsewhere(tmp_path, key):
    src = Versions(tmp_path, key)
    src.publish(0)
    origin = src.origin
    url, pub = origin.start(), public_key_hex(key)
    src.seed(tmp_path / "client", 0)

    async def main():
        stop = asyncio.Event()
        bad, good = await start_relays([url], pub, tmp_path, stop, n=2)
        src.publish(1)
        patch = read_manifest(src.weights.path(1)).patches[0].file.name
        await until(lambda: all(
            (tmp_path / f"relay-{i}/step_000001/manifest.json").exists() for i in (0, 1)))  # fmt: skip
        # relay-0 flips a byte of the patch it serves
        p = tmp_path / "relay-0/step_000001" / patch
        blob = bytearray(p.read_bytes())
        blob[len(blob) // 2] ^= 0x40
        p.write_bytes(bytes(blob))
        got, reports = [], []
        client = Follower(
            [bad, good], pub, tmp_path / "client", on_fetched=got.append,
            on_bad_data=lambda url, what: reports.append((url, what)),
        )  # fmt: skip
        task = asyncio.create_task(client.run(stop))
        await until(lambda: got)
        stop.set()
        await task
        return client, got, bad, reports, patch

    client, got, bad, reports, patch = _run(origin, main())
    assert got[0].patched_from == 0 and got[0].bytes < got[0].full_bytes / 10
    assert (client.local.path(1) / "model.safetensors").read_bytes() == src.data[1]
    assert [u for u, _ in reports] == [bad] and patch in reports[0][1], reports


def test_a_node_whose_version_is_not_the_patch_base_takes_the_files(tmp_path, key):
    src = Versions(tmp_path, key)
    src.publish(0)
    src.publish(1)
    # the node holds a version 0 signed by the same trainer but with other bytes
    other = LocalWeights(tmp_path / "other", key=key, shard_bytes=SHARD)
    d = other.staging_dir(0)
    (d / "model.safetensors").write_bytes(np.zeros(N, np.uint16).tobytes())
    (d / "config.json").write_text('{"dtype": "bfloat16"}')
    other.publish(0)
    shutil.copytree(other.path(0), tmp_path / "client" / other.path(0).name)
    origin = src.origin
    url, pub = origin.start(), public_key_hex(key)

    async def main():
        stop, got = asyncio.Event(), []
        client = Follower([url], pub, tmp_path / "client", on_fetched=got.append)
        task = asyncio.create_task(client.run(stop))
        await until(lambda: got)
        stop.set()
        await task
        return client, got

    client, got = _run(origin, main())
    assert got[0].version == 1 and got[0].patched_from is None
    assert got[0].bytes == got[0].full_bytes
    assert (client.local.path(1) / "model.safetensors").read_bytes() == src.data[1]


def test_a_relay_restarted_in_the_middle_of_a_chain_serves_the_rest(tmp_path, key):
    src = Versions(tmp_path, key)
    src.publish(0)
    origin = src.origin
    url, pub = origin.start(), public_key_hex(key)
    src.seed(tmp_path / "client", 0)

    async def main():
        relay_stop, stop = asyncio.Event(), asyncio.Event()
        ports: list[int] = []
        relay = asyncio.create_task(serve_relay(
            [url], pub, tmp_path / "relay", stop=relay_stop, on_ready=ports.append))  # fmt: skip
        await until(lambda: ports)
        relay_url = f"http://127.0.0.1:{ports[0]}"
        got = []
        client = Follower([relay_url], pub, tmp_path / "client", on_fetched=got.append)
        task = asyncio.create_task(client.run(stop))
        src.publish(1)
        await until(lambda: got and got[-1].version == 1)
        relay_stop.set()  # the relay goes down with version 1 (and its patch) on disk
        await relay
        src.publish(2)
        src.publish(3)
        relay_stop = asyncio.Event()
        relay = asyncio.create_task(serve_relay(
            [url], pub, tmp_path / "relay", port=ports[0], stop=relay_stop))  # fmt: skip
        await until(lambda: got[-1].version == 3, timeout=30)
        stop.set()
        relay_stop.set()
        await asyncio.gather(task, relay)
        return client, got

    client, got = _run(origin, main())
    assert all(f.patched_from == f.version - 1 for f in got), got
    assert got[-1].version == 3
    assert (client.local.path(3) / "model.safetensors").read_bytes() == src.data[3]
    # the restarted relay kept version 1 (verified with its patch) and patched up from it
    relay = LocalWeights(tmp_path / "relay", trusted_key=pub)
    assert relay.versions()[-1] == 3
    verify_version(relay.path(3), pub, patches=True)
