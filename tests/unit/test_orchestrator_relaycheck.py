"""Relays are advertised only once the orchestrator has fetched and verified a manifest
of the run from them, and stop being advertised when they no longer serve one
(orchestrator/relaycheck.py). Real HTTP on loopback: an honest SHARDCAST server, and
relays that answer with the wrong key, garbage, too much, a redirect or nothing."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web
from nacl.signing import SigningKey

from swarmrl.orchestrator.relaycheck import RelayChecker
from tests.unit.orch_util import Orch, pubhex
from tests.unit.relay_util import (
    FakeRelay,
    body_of,
    honest_relay,
    manifest_bytes,
    versions_of,
)

LOOPBACK = 'orchestrator.relay_networks=["127.0.0.0/8"]'


def _register(o: Orch, url: str, name: str = "relay"):
    key = o.worker(name)
    o.ok(key, "POST", "/v1/nodes/register", {"role": "relay", "url": url})
    return key


def _servers(o: Orch) -> list[str]:
    servers = o.http.get("/v1/run/servers").json()["servers"]
    assert o.http.get("/v1/run").json()["servers"] == servers
    return servers


def _check(o: Orch) -> dict:
    return RelayChecker(o.svc).run_due()


def test_a_relay_is_advertised_once_a_manifest_of_the_run_verifies(orch):
    o = orch(LOOPBACK)
    relay = honest_relay(o.tmp, o.trainer, versions=(0,))
    try:
        _register(o, relay.url)
        assert _servers(o) == []  # registered, not verified
        assert _check(o) == {}  # nothing published yet: nothing to verify
        assert _servers(o) == []
        o.open_step(1, 0)
        outcome = _check(o)[relay.url]
        assert outcome.kind == "verified" and outcome.version == 0
        assert _servers(o) == [relay.url]
        assert _check(o) == {}  # checked again only after orchestrator.relay_check_s
        o.clock.t += o.cfg.orchestrator.relay_check_s
        assert _check(o)[relay.url].kind == "verified"
        # a restart keeps what was verified, and advertises nothing that was not
        late = honest_relay(o.tmp, o.trainer, versions=(0,))
        _register(o, late.url, "late")
        o.restart()
        assert _servers(o) == [relay.url]
        assert _check(o)[late.url].kind == "verified"
        assert sorted(_servers(o)) == sorted([relay.url, late.url])
        late.stop()
    finally:
        relay.stop()


def test_the_newest_version_within_async_level_is_checked_and_a_lagging_relay_is_not_listed(
    tmp_path,
):
    o = Orch(tmp_path, LOOPBACK, "async_level=2")
    relay = honest_relay(o.tmp, o.trainer, versions=(0, 1, 2, 3))
    try:
        _register(o, relay.url)
        o.open_step(3, 2)  # the trainer announced 2; the relay also has 3 already
        assert _check(o)[relay.url].version == 2
        o.open_step(6, 5)  # window [3, 5]: 3 is still of use
        o.clock.t += o.cfg.orchestrator.relay_check_s
        assert _check(o)[relay.url].version == 3
        o.open_step(7, 6)  # window [4, 6]: the relay would serve stale weights only
        for _ in range(o.cfg.orchestrator.relay_check_failures):
            assert _servers(o) == [relay.url]  # a relay a publish behind is not dropped at once
            o.clock.t += o.cfg.orchestrator.relay_check_s
            outcome = _check(o)[relay.url]
            assert outcome.kind == "failed" and "no version in [4, 6]" in outcome.detail
        assert _servers(o) == []
    finally:
        relay.stop()


def test_an_advertised_relay_that_goes_away_is_dropped_after_n_failed_checks_then_back(orch):
    o = orch(
        LOOPBACK, "orchestrator.relay_check_failures=3", "orchestrator.relay_check_timeout_s=1"
    )
    relay = honest_relay(o.tmp, o.trainer, versions=(0,))
    port = relay.port
    _register(o, relay.url)
    o.open_step(1, 0)
    assert _check(o)[relay.url].kind == "verified"
    relay.stop()
    for n in range(3):
        assert _servers(o) == [relay.url], n
        o.clock.t += o.cfg.orchestrator.relay_check_s
        assert _check(o)[relay.url].kind == "failed"
    assert _servers(o) == []
    back = honest_relay(o.tmp, o.trainer, versions=(0,), port=port)  # verifies again: listed
    try:
        o.clock.t += o.cfg.orchestrator.relay_check_s
        assert _check(o)[relay.url].kind == "verified"
        assert _servers(o) == [relay.url]
    finally:
        back.stop()


def test_a_relay_that_starts_serving_another_runs_manifest_is_dropped_at_once(tmp_path):
    o = Orch(tmp_path, LOOPBACK)
    state = {"key": o.trainer}

    async def manifest(_request):
        return web.Response(body=manifest_bytes(0, state["key"]))

    relay = FakeRelay(versions_of(0), manifest)
    try:
        key = _register(o, relay.url)
        o.open_step(1, 0)
        assert _check(o)[relay.url].kind == "verified"
        state["key"] = SigningKey.generate()  # now it follows another run's origin
        o.clock.t += o.cfg.orchestrator.relay_check_s
        assert _check(o)[relay.url].kind == "wrong"
        assert _servers(o) == []
        assert o.ledger()[pubhex(key)]["state"] == "registered"  # misconfigured, not ejected
        state["key"] = o.trainer
        o.clock.t += o.cfg.orchestrator.relay_check_s
        assert _check(o)[relay.url].kind == "verified"
        assert _servers(o) == [relay.url]
    finally:
        relay.stop()


def _hostile_relays(o: Orch, honest_url: str) -> dict[str, tuple]:
    """name -> (versions handler, manifest handler, expected kind, words in the detail)."""

    async def redirect(_request):
        raise web.HTTPFound(honest_url + "/versions")  # following it would verify

    async def hang(_request):
        await asyncio.sleep(30)
        return web.json_response({"versions": [0]})

    async def drip(request):
        resp = web.StreamResponse()
        await resp.prepare(request)
        for b in manifest_bytes(0, o.trainer):
            await resp.write(bytes([b]))
            await asyncio.sleep(0.05)
        return resp

    async def endless(request):  # no Content-Length: the cap must hold while streaming
        resp = web.StreamResponse()
        await resp.prepare(request)
        for _ in range(64):
            await resp.write(b" " * (64 << 10))
        return resp

    async def gzip(_request):
        return web.Response(body=manifest_bytes(0, o.trainer), headers={"Content-Encoding": "gzip"})

    async def error(_request):
        raise web.HTTPInternalServerError()

    good = body_of(manifest_bytes(0, o.trainer))
    return {
        "another-run": (versions_of(0), body_of(manifest_bytes(0, SigningKey.generate())),
                        "wrong", "not by the run's key"),
        "unsigned": (versions_of(0), body_of(manifest_bytes(0)), "wrong", "signed not"),
        "other-version": (versions_of(0), body_of(manifest_bytes(1, o.trainer)), "wrong",
                          "asked for version 0, got 1"),
        "forged": (versions_of(0), body_of(manifest_bytes(0, o.trainer, forge=True)), "forged",
                   "bad signature"),
        "garbage": (versions_of(0), body_of(b"\x00not a manifest"), "failed", "malformed"),
        "garbage-versions": (body_of(b"[1, 2"), good, "failed", "not a version list"),
        "huge-versions": (versions_of(*range(20000)), good, "failed", "over 65536 bytes"),
        "oversized": (versions_of(0), body_of(b" " * (2 << 20)), "failed", "over 1048576 bytes"),
        "endless": (versions_of(0), endless, "failed", "over 1048576 bytes"),
        "redirect": (redirect, good, "failed", "redirect (HTTP 302)"),
        "hanging": (hang, good, "failed", "no complete answer within 1 s"),
        "drip": (versions_of(0), drip, "failed", "no complete answer within 1 s"),
        "compressed": (versions_of(0), gzip, "failed", "compressed"),
        "error": (versions_of(0), error, "failed", "HTTP 500"),
        "stale": (versions_of(7), good, "failed", "no version in [0, 0]"),
    }  # fmt: skip


def test_relays_that_do_not_serve_a_verified_manifest_are_not_advertised(tmp_path):
    """All checked in one pass, at once: the pass ends within the check's timeout even
    with relays that hang or drip; a forged manifest ejects the relay's key."""
    o = Orch(tmp_path, LOOPBACK, "orchestrator.relay_check_timeout_s=1")
    honest = honest_relay(o.tmp, o.trainer, versions=(0,))
    fakes, keys, expected = {}, {}, {}
    try:
        for name, (versions, manifest, kind, words) in _hostile_relays(o, honest.url).items():
            fakes[name] = FakeRelay(versions, manifest)
            keys[name] = _register(o, fakes[name].url, name)
            expected[fakes[name].url] = (name, kind, words)
        o.open_step(1, 0)
        t0 = time.monotonic()
        outcomes = _check(o)
        assert time.monotonic() - t0 < 2.5
        for url, (name, kind, words) in expected.items():
            assert outcomes[url].kind == kind and words in outcomes[url].detail, (
                name,
                outcomes[url],
            )
        assert _servers(o) == []
        ledger = o.ledger()
        for name, key in keys.items():
            want = "ejected" if name == "forged" else "registered"
            assert ledger[pubhex(key)]["state"] == want, name
        assert "forged manifest" in ledger[pubhex(keys["forged"])]["reason"]
        assert ledger[pubhex(keys["forged"])]["slashed"] == 0
    finally:
        for f in fakes.values():
            f.stop()
        honest.stop()


def test_the_address_is_vetted_again_right_before_the_fetch(tmp_path):
    """The operator's allowed networks (or what the name resolves to) may change after
    registration: the check refuses to fetch, and the relay is not advertised."""
    o = Orch(tmp_path, LOOPBACK)
    asked = []

    async def versions(request):
        asked.append(request.path)
        return web.json_response({"versions": [0]})

    relay = FakeRelay(versions, body_of(manifest_bytes(0, o.trainer)))
    try:
        _register(o, relay.url)
        o.open_step(1, 0)
        o.svc.cfg.orchestrator.relay_networks = []
        outcome = _check(o)[relay.url]
        assert outcome.kind == "failed" and "refused: 127.0.0.1 is loopback" in outcome.detail
        assert asked == [] and _servers(o) == []
    finally:
        relay.stop()


def test_the_operators_own_servers_are_neither_checked_nor_dropped(tmp_path):
    """`swarmrl rl` lists its relays in shardcast.servers, and they register too."""
    url = "http://127.0.0.1:9"  # nothing listens there
    o = Orch(tmp_path, LOOPBACK, f'shardcast.servers=["{url}"]')
    _register(o, url)
    o.open_step(1, 0)
    assert _check(o) == {}
    assert _servers(o) == [url]


@pytest.mark.parametrize("state", ["dead", "banned"])
def test_a_relay_that_comes_back_from_dead_or_a_ban_is_verified_again(tmp_path, state):
    o = Orch(tmp_path, LOOPBACK)
    relay = honest_relay(o.tmp, o.trainer, versions=(0,))
    try:
        key = _register(o, relay.url)
        o.open_step(1, 0)
        assert _check(o)[relay.url].kind == "verified"
        if state == "dead":
            o.clock.t += o.cfg.orchestrator.dead_after_s + 1
            from swarmrl.orchestrator.nodes import sweep

            sweep(o.svc)
        else:
            auth = {"Authorization": f"Bearer {o.token}"}
            o.http.post(f"/v1/admin/nodes/{pubhex(key)}/ban", headers=auth).raise_for_status()
            o.http.post(f"/v1/admin/nodes/{pubhex(key)}/unban", headers=auth).raise_for_status()
        assert _check(o) == {} and _servers(o) == []
        _register(o, relay.url)
        assert _servers(o) == []  # its earlier check was forgotten with it
        assert _check(o)[relay.url].kind == "verified"
        assert _servers(o) == [relay.url]
    finally:
        relay.stop()


def test_the_fetch_goes_to_the_vetted_addresses_whatever_the_name_resolves_to(
    tmp_path, monkeypatch
):
    """A name the system cannot resolve, vetted as 127.0.0.1: the check reaches the relay
    only because the connection is pinned to what was vetted."""
    from swarmrl.orchestrator import relays

    vetted = relays.resolve
    monkeypatch.setattr(
        relays,
        "resolve",
        lambda h, p=80: vetted("127.0.0.1") if h == "relay.invalid" else vetted(h, p),
    )
    o = Orch(tmp_path, LOOPBACK)
    honest = honest_relay(o.tmp, o.trainer, versions=(0,))
    url = f"http://relay.invalid:{honest.port}"
    try:
        _register(o, url)
        o.open_step(1, 0)
        assert _check(o)[url].kind == "verified"
        assert _servers(o) == [url]
    finally:
        honest.stop()


def test_the_sweeper_runs_the_checks(tmp_path):
    from fastapi.testclient import TestClient

    from swarmrl.orchestrator.app import build_app

    o = Orch(tmp_path, LOOPBACK)
    relay = honest_relay(o.tmp, o.trainer, versions=(0,))
    try:
        _register(o, relay.url)
        o.open_step(1, 0)
        with TestClient(build_app(o.svc, sweep_every_s=0.05)) as http:
            deadline = time.monotonic() + 10
            while http.get("/v1/run/servers").json()["servers"] != [relay.url]:
                assert time.monotonic() < deadline, "the sweeper never listed the relay"
                time.sleep(0.05)
    finally:
        relay.stop()
