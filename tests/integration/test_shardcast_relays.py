"""SHARDCAST with relays as real processes (`swarmrl relay`) on loopback."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

from swarmrl.launch.supervisor import free_port
from swarmrl.protocol.identity import load_or_create_key, public_key_hex
from swarmrl.protocol.manifest import verify_version
from swarmrl.shardcast.client import Follower
from swarmrl.shardcast.local import LocalWeights
from swarmrl.shardcast.origin import Origin
from tests.integration.conftest import ROOT

SHARD = 256 * 1024


def _start_relay(upstream: str, pub: str, directory, port: int, log) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "swarmrl", "relay", "--upstream", upstream]
        + ["--port", str(port), "--dir", str(directory)]
        + [f"shardcast.public_key={pub}", "shardcast.max_upload_mbps=2"],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
        start_new_session=True,
    )


def test_relay_killed_mid_transfer_clients_finish_from_the_other(tmp_path):
    key = load_or_create_key(tmp_path / "trainer.key")
    pub = public_key_hex(key)
    w = LocalWeights(tmp_path / "origin", key=key, shard_bytes=SHARD, trusted_key=pub)
    data = os.urandom(24 * SHARD)  # 6 MB; each relay uploads at most 2 MB/s
    d = w.staging_dir(0)
    (d / "model.safetensors").write_bytes(data)
    w.publish(0)
    origin = Origin(w)
    url = origin.start()
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    log = open(tmp_path / "relays.log", "wb")
    relays = [_start_relay(url, pub, tmp_path / f"relay-{i}", p, log) for i, p in enumerate(ports)]

    async def main():
        import aiohttp

        deadline = time.monotonic() + 60
        async with aiohttp.ClientSession() as s:  # both relays hold version 0 before we start
            for u in urls:
                while True:
                    assert time.monotonic() < deadline, f"relay {u} did not come up"
                    try:
                        async with s.get(f"{u}/versions?after=-1&wait=30") as r:
                            if (await r.json())["versions"] == [0]:
                                break
                    except aiohttp.ClientConnectionError:
                        await asyncio.sleep(0.1)
        received: dict[str, int] = {}
        got = []

        def progress(version, name, index, nbytes):
            received[(name, index)] = nbytes

        client = Follower(
            urls, pub, tmp_path / "client", on_progress=progress, on_fetched=got.append
        )
        stop = asyncio.Event()
        task = asyncio.create_task(client.run(stop))
        # kill relay-0 once the client is well into the download from both relays
        while sum(received.values()) < len(data) // 4:
            assert time.monotonic() < deadline, "download did not start"
            await asyncio.sleep(0.05)
        victim = max(range(2), key=lambda i: client.pool.servers[urls[i]].active)
        active_on_victim = client.pool.servers[urls[victim]].active
        relays[victim].send_signal(signal.SIGKILL)
        while not got:
            assert time.monotonic() < deadline, "client did not finish after the relay died"
            await asyncio.sleep(0.05)
        stop.set()
        await task
        return client, victim, active_on_victim

    try:
        client, victim, active_on_victim = asyncio.run(main())
    finally:
        origin.stop()
        for p in relays:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in relays:
            p.wait(timeout=20)
        log.close()
    assert active_on_victim > 0  # it died with transfers in progress
    assert (client.local.path(0) / "model.safetensors").read_bytes() == data
    verify_version(client.local.path(0), pub)
    dead, alive = client.pool.servers[urls[victim]], client.pool.servers[urls[1 - victim]]
    assert dead.failures > 0 and dead.ema_ok < alive.ema_ok
    assert alive.bytes > 0 and dead.bytes < len(data)
    assert relays[1 - victim].returncode == 0  # the survivor stopped cleanly on SIGTERM
