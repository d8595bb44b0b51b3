"""A relay's standing (orchestrator/relaystanding.py): reports count against its key,
delisting holds its key and its address, reports are bounded per reporter, and the run
holds a bounded number of relays, shared per address range."""

from __future__ import annotations

import dataclasses

from swarmrl.orchestrator.relaycheck import RelayChecker
from swarmrl.protocol.identity import public_key_hex
from swarmrl.protocol.verdict import Verdict
from tests.unit.orch_util import Orch
from tests.unit.relay_util import honest_relay

LOOPBACK = 'orchestrator.relay_networks=["127.0.0.0/8", "::1/128"]'


def _accepted_worker(o: Orch, name: str, payload: bytes):
    """A registered worker with one file accepted by the validator (a reporter that counts)."""
    w = o.worker(name)
    o.register(w)
    a = o.assignment(w, 0)["assignment"]
    o.upload(w, a["counter"], payload)
    f = o.ok(o.validator, "POST", "/v1/validation/claim", {"max_policy": 0})["file"]
    v = Verdict(f["key"], f["sha256"], f["node"], f["assignment"]["step"],
                f["assignment"]["policy_step"], True)  # fmt: skip
    o.ok(o.validator, "POST", "/v1/validation/verdict",
         {"verdict": dataclasses.asdict(v.signed(o.validator))})  # fmt: skip
    return w


def _register_relay(o: Orch, key, url: str):
    return o.call(key, "POST", "/v1/nodes/register", {"role": "relay", "url": url})


def test_a_delisted_relay_does_not_return_under_another_url_or_key(orch):
    """Two reports delist a relay; its key under another URL for the same server, or a
    new key at its address, stay off the list until the hold has passed."""
    o = orch("orchestrator.relay_reports=2", "orchestrator.relay_hold_s=600",
             "trainer.batch_groups=1000", LOOPBACK)  # fmt: skip
    server = honest_relay(o.tmp, o.trainer, versions=(0,))
    first = server.url  # http://127.0.0.1:PORT
    second = first + "/b"  # another URL of the same key and address
    by_name = first.replace("127.0.0.1", "localhost")  # its address, by name
    try:
        relay = o.worker("relay")
        assert _register_relay(o, relay, first).status_code == 200
        o.open_step(1, 0)
        assert RelayChecker(o.svc).run_due()[first].kind == "verified"
        assert o.http.get("/v1/run/servers").json()["servers"] == [first]
        worker = _accepted_worker(o, "w", b"a file")
        report = {"url": first, "what": "bad shard"}
        assert o.ok(o.validator, "POST", "/v1/relays/report", report)["counted"]
        assert o.ok(worker, "POST", "/v1/relays/report", report)["delisted"]
        assert o.http.get("/v1/run/servers").json()["servers"] == []
        assert o.ledger()[public_key_hex(relay)]["state"] == "delisted"
        # the same key under another URL: held
        r = _register_relay(o, relay, second)
        assert r.status_code == 403 and "this key was delisted" in r.json()["detail"]
        r = o.call(relay, "POST", "/v1/nodes/heartbeat", {"want_work": False})
        assert r.status_code == 403 and "delisted" in r.json()["detail"]
        # a new key at the same address, by either URL or by a name for it: held
        for url in (first, second, by_name):
            r = _register_relay(o, o.worker("relay2"), url)
            assert r.status_code == 403 and "the address 127.0.0.1 " in r.json()["detail"]
        RelayChecker(o.svc).run_due()
        assert o.http.get("/v1/run/servers").json()["servers"] == []
        # after the hold the key registers as a new key does, and is advertised only once
        # its check passes again
        o.clock.t += 601
        assert _register_relay(o, relay, first).status_code == 200
        assert o.http.get("/v1/run/servers").json()["servers"] == []
        assert RelayChecker(o.svc).run_due()[first].kind == "verified"
        assert o.http.get("/v1/run/servers").json()["servers"] == [first]
        # delisted again: held twice as long
        for k in (o.validator, worker):
            o.ok(k, "POST", "/v1/relays/report", {"url": first, "what": "x"})
        o.clock.t += 601
        assert _register_relay(o, relay, first).status_code == 403
        o.clock.t += 600
        assert _register_relay(o, relay, first).status_code == 200
    finally:
        server.stop()


def test_reports_are_bounded_per_reporter_and_kept_only_for_live_relays(tmp_path):
    """One worker with one accepted file reporting 200 URLs leaves at most 16 rows, and
    none for a URL that no relay registered or for the operator's own servers."""
    o = Orch(tmp_path, "trainer.batch_groups=1000", LOOPBACK,
             'shardcast.servers=["http://127.0.0.1:9"]')  # fmt: skip
    o.open_step(1, 0)
    worker = _accepted_worker(o, "w", b"a file")
    for i in range(200):
        answer = o.ok(worker, "POST", "/v1/relays/report", {"url": f"http://127.0.0.1:{i + 1}"})
        assert not answer["counted"]
    assert o.svc.db.one("SELECT COUNT(*) FROM relay_reports")[0][0] == 0
    for i in range(40):  # 40 registered relays, each reported once by the same worker
        assert (
            _register_relay(o, o.worker(f"r{i}"), f"http://127.0.0.2:{1000 + i}").status_code == 200
        )
        o.clock.t += 1.0
        assert o.ok(worker, "POST", "/v1/relays/report", {"url": f"http://127.0.0.2:{1000 + i}"})[
            "counted"
        ]
    rows = o.svc.db.one("SELECT relay FROM relay_reports WHERE reporter = ?",
                        (public_key_hex(worker),))  # fmt: skip
    assert len(rows) == 16  # its newest
    # reports lapse after relay_report_s
    o.clock.t += o.cfg.orchestrator.relay_report_s + 1
    from swarmrl.orchestrator import nodes

    nodes.sweep(o.svc)
    assert o.svc.db.one("SELECT COUNT(*) FROM relay_reports")[0][0] == 0


def test_the_run_holds_a_bounded_number_of_relays_shared_per_range(tmp_path):
    o = Orch(tmp_path, "orchestrator.max_relays=6", "orchestrator.range_share=0.5",
             'orchestrator.relay_networks=["0.0.0.0/0"]')  # fmt: skip
    one = o.at("203.0.113.7")  # one /24
    answers = [
        _register_relay(one, o.worker(f"a{i}"), f"http://198.51.100.{i + 1}:80").status_code
        for i in range(4)
    ]
    assert answers == [200, 200, 200, 429]  # half of 6 from one range
    other = o.at("192.0.2.9")
    answers = [
        _register_relay(other, o.worker(f"b{i}"), f"http://198.51.100.{i + 20}:80").status_code
        for i in range(4)
    ]
    assert answers == [200, 200, 200, 429]  # the rest; the run is full
    r = _register_relay(o.at("100.64.0.1"), o.worker("c"), "http://198.51.100.99:80")
    assert r.status_code == 429 and "most relays (6)" in r.json()["detail"]


def test_a_delisting_holds_the_server_not_one_spelling_of_it(tmp_path):
    """A URL registered with trailing slashes is reported without them; a second key at
    the same endpoint goes with the first; the host is held on every port."""
    o = Orch(tmp_path, "orchestrator.relay_reports=2", "trainer.batch_groups=1000",
             LOOPBACK)  # fmt: skip
    o.open_step(1, 0)
    worker = _accepted_worker(o, "w", b"a file")
    one, two = o.worker("r1"), o.worker("r2")
    assert _register_relay(o, one, "http://127.0.0.3:7000//").status_code == 200
    assert _register_relay(o, two, "http://127.0.0.3:7000/b").status_code == 200
    assert _register_relay(o, o.worker("r3"), "http://127.0.0.4:7000").status_code == 200
    for k in (o.validator, worker):
        answer = o.ok(k, "POST", "/v1/relays/report", {"url": "http://127.0.0.3:7000"})
        assert answer["counted"], answer
    states = {k: v["state"] for k, v in o.ledger().items()}
    assert states[public_key_hex(one)] == states[public_key_hex(two)] == "delisted"
    assert states[public_key_hex(o.worker("r3"))] == "registered"  # another host
    r = _register_relay(o, o.worker("r4"), "http://127.0.0.3:7001")  # another port
    assert r.status_code == 403 and "the address 127.0.0.3 " in r.json()["detail"]


def test_a_relay_that_never_verifies_does_not_hold_a_place(tmp_path):
    """Past its first checks' grace, an unadvertised relay no longer counts toward
    max_relays: keys that register unreachable URLs cannot keep honest relays out."""
    o = Orch(tmp_path, "orchestrator.max_relays=2", "orchestrator.relay_check_s=30",
             "orchestrator.relay_check_failures=3", LOOPBACK)  # fmt: skip
    for i in range(2):
        assert (
            _register_relay(o, o.worker(f"bogus{i}"), f"http://127.0.0.5:{i + 1}").status_code
            == 200
        )
    r = _register_relay(o, o.worker("honest"), "http://127.0.0.6:80")
    assert r.status_code == 429 and "most relays (2)" in r.json()["detail"]
    o.clock.t += 30 * 4 + 1  # past relay_check_s x (relay_check_failures + 1)
    assert _register_relay(o, o.worker("honest"), "http://127.0.0.6:80").status_code == 200
