"""The ledger suite: nodes, assignments, uploads, verdicts, slashing and finality,
run on SQLite and on a real PostgreSQL server."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from swarmrl.orchestrator.relaycheck import RelayChecker
from swarmrl.protocol.identity import public_key_hex
from swarmrl.protocol.verdict import Verdict
from tests.unit.orch_util import HW, Orch
from tests.unit.relay_util import honest_relay

AUTH = "Authorization"


def _verdict(o: Orch, f: dict, accepted: bool, check: str = "") -> dict:
    v = Verdict(f["key"], f["sha256"], f["node"], f["assignment"]["step"],
                f["assignment"]["policy_step"], accepted, check=check,
                reason="" if accepted else "proof mismatch")  # fmt: skip
    return {"verdict": dataclasses.asdict(v.signed(o.validator))}


def _file(o: Orch, key, policy: int, payload: bytes) -> dict:
    a = o.assignment(key, policy)["assignment"]
    return o.upload(key, a["counter"], payload)


def test_work_flows_from_assignment_to_training(orch):
    o = orch()
    w = o.worker("a")
    assert o.call(w, "POST", "/v1/nodes/heartbeat", {"want_work": True}).status_code == 403
    assert o.register(w) == {"state": "registered", "stake": 100.0, "max_new_tokens": 16}
    assert o.assignment(w, 0)["wait"] == "no-trainer"
    o.open_step(1, 0)
    a = o.assignment(w, 0)["assignment"]
    assert a["step"] == 1 and a["policy_step"] == 0 and a["counter"] >= 1
    assert o.assignment(w, 0)["assignment"]["counter"] == a["counter"]  # a lost answer: same
    g = o.upload(w, a["counter"], b"file one")
    claim = o.ok(o.validator, "POST", "/v1/validation/claim", {"max_policy": 0})
    f = claim["file"]
    assert f["key"] == g["key"] and f["assignment"]["seed"] == a["seed"]
    assert o.http.get(f["url"].removeprefix("http://testserver")).content == b"file one"
    assert o.ok(o.validator, "POST", "/v1/validation/claim", {"max_policy": 0})["file"] is None
    assert (
        o.ok(o.validator, "POST", "/v1/validation/verdict", _verdict(o, f, True))["state"]
        == "accepted"
    )
    files = o.ok(o.trainer, "GET", "/v1/trainer/files", params={"step": 1})["files"]
    assert [x["key"] for x in files] == [g["key"]] and files[0]["verdict"]["accepted"]
    assert o.ok(o.trainer, "POST", "/v1/trainer/consume", {"step": 1, "keys": [g["key"]]})[
        "consumed"
    ] == [g["key"]]
    assert o.ok(o.trainer, "GET", "/v1/trainer/files", params={"step": 1})["files"] == []
    # a crash before version 1 was published: resume(0) puts the file back
    assert o.ok(o.trainer, "POST", "/v1/trainer/resume", {"version": 0})["returned"] == 1
    assert len(o.ok(o.trainer, "GET", "/v1/trainer/files", params={"step": 1})["files"]) == 1
    o.ok(o.trainer, "POST", "/v1/trainer/consume", {"step": 1, "keys": [g["key"]]})
    o.ok(o.trainer, "POST", "/v1/trainer/published", {"version": 1})
    assert o.svc.objects.size(g["key"]) == 8  # trained, kept for the dashboard's viewer
    keep = o.cfg.orchestrator.keep_trained_steps
    o.ok(o.trainer, "POST", "/v1/trainer/published", {"version": 1 + keep})
    assert o.svc.objects.size(g["key"]) is None  # then the object is gone, the record stays
    assert o.ledger()[public_key_hex(w)]["accepted"] == 1


def test_counters_are_issued_not_chosen_and_capacity_is_bounded(orch):
    o = orch("trainer.batch_groups=16", "worker.groups_per_file=8")
    a, b = o.worker("a"), o.worker("b")
    o.register(a), o.register(b)
    o.open_step(1, 0)
    ca = o.assignment(a, 0)["assignment"]["counter"]
    cb = o.assignment(b, 0)["assignment"]["counter"]
    assert ca != cb
    c = o.worker("c")
    o.register(c)
    assert o.assignment(c, 0)["wait"] == "enough-work"  # 16 groups out already
    # a counter it was not issued, or another node's: refused, nothing recorded
    sha = hashlib.sha256(b"x").hexdigest()
    for counter in (cb, 999):
        r = o.call(a, "POST", "/v1/uploads", {"counter": counter, "size": 1, "sha256": sha})
        assert r.status_code == 403
    o.upload(a, ca, b"from a")
    r = o.call(
        b,
        "POST",
        "/v1/uploads",
        {"counter": cb, "size": 6, "sha256": hashlib.sha256(b"from a").hexdigest()},
    )
    assert r.status_code == 409  # the same bytes twice: a replay
    assert o.assignment(a, 2)["wait"] == "unknown-policy"


def test_silent_node_goes_unhealthy_then_dead_and_its_work_is_reissued(orch):
    from swarmrl.orchestrator.nodes import sweep

    o = orch("orchestrator.unhealthy_after_s=5", "orchestrator.dead_after_s=20")
    a, b = o.worker("a"), o.worker("b")
    o.register(a), o.register(b)
    o.open_step(1, 0)
    lost = o.assignment(a, 0)["assignment"]
    o.clock.t += 6
    o.ok(b, "POST", "/v1/nodes/heartbeat", {"want_work": False})  # b heartbeats; a is silent
    sweep(o.svc)
    led = o.ledger()
    assert (
        led[public_key_hex(a)]["state"] == "unhealthy"
        and led[public_key_hex(b)]["state"] == "healthy"
    )
    o.clock.t += 20
    o.ok(b, "POST", "/v1/nodes/heartbeat", {"want_work": False})
    sweep(o.svc)
    assert o.ledger()[public_key_hex(a)]["state"] == "dead"
    got = o.assignment(b, 0)["assignment"]
    assert got["reissue_of"] == lost["counter"] and got["step"] == 1
    r = o.call(a, "POST", "/v1/nodes/heartbeat", {"want_work": True})
    assert r.status_code == 409  # dead: must register again
    assert o.register(a)["state"] == "registered"
    assert o.ledger()[public_key_hex(a)]["stake"] == 100.0  # the stake was not taken twice


def test_cheater_is_ejected_voided_slashed_and_cannot_come_back(orch):
    from swarmrl.orchestrator.files import finalize

    o = orch(
        "orchestrator.validity_window_s=100",
        "orchestrator.slash_fraction=0.5",
        "trainer.batch_groups=1000",
    )
    honest, cheat = o.worker("honest"), o.worker("cheat")
    o.register(honest), o.register(cheat)
    o.open_step(1, 0)
    _file(o, honest, 0, b"honest 1")
    _file(o, cheat, 0, b"cheat 1")
    judged = {}
    for _ in range(2):
        f = o.ok(o.validator, "POST", "/v1/validation/claim", {"max_policy": 0})["file"]
        judged[f["node"]] = o.ok(o.validator, "POST", "/v1/validation/verdict",
                                 _verdict(o, f, True))  # fmt: skip
    assert all(v["state"] == "accepted" for v in judged.values())
    _file(o, cheat, 0, b"cheat 2")
    f = o.ok(o.validator, "POST", "/v1/validation/claim", {"max_policy": 0})["file"]
    r = o.ok(o.validator, "POST", "/v1/validation/verdict", _verdict(o, f, False, "proof"))
    assert r == {"state": "rejected", "ejected": True}
    led = o.ledger()
    c, h = led[public_key_hex(cheat)], led[public_key_hex(honest)]
    assert c["state"] == "ejected" and c["slashed"] == 50.0 and c["stake"] == 50.0
    assert c["void"] == 1 and c["rejected"] == 1 and c["accepted"] == 0  # accepted: now void
    assert c["blameless"] == 0 and h["blameless"] == 0
    assert h["state"] == "healthy" and h["slashed"] == 0 and h["accepted"] == 1
    assert "proof" in c["reason"]
    files = o.ok(o.trainer, "GET", "/v1/trainer/files", params={"step": 1})["files"]
    assert [x["node"] for x in files] == [public_key_hex(honest)]
    r = o.call(cheat, "POST", "/v1/nodes/register", {"role": "worker", "hardware": HW})
    assert r.status_code == 403
    assert o.call(cheat, "POST", "/v1/nodes/heartbeat", {"want_work": True}).status_code == 403
    assert finalize(o.svc) == 0
    o.clock.t += 101
    assert finalize(o.svc) == 1
    assert o.ledger()[public_key_hex(honest)]["final"] == 1
    events = o.http.get("/v1/ledger").json()
    assert events["nodes"][0]["key"] == public_key_hex(honest)


@pytest.mark.parametrize("check", ["error", "unverifiable"])
def test_a_validator_error_refuses_the_file_without_punishing(orch, check):
    """`error`: the validator's own failure; `unverifiable`: a Python tool answer it
    cannot settle. Either refuses the file and blames no one."""
    o = orch()
    w = o.worker("a")
    o.register(w)
    o.open_step(1, 0)
    _file(o, w, 0, b"breaks the checker")
    f = o.ok(o.validator, "POST", "/v1/validation/claim", {"max_policy": 0})["file"]
    r = o.ok(o.validator, "POST", "/v1/validation/verdict", _verdict(o, f, False, check))
    assert r == {"state": "rejected", "ejected": False}
    row = o.ledger()[public_key_hex(w)]
    assert row["state"] == "healthy"
    assert row["rejected"] == row["blameless"] == 1  # counted apart: an operator sees them


def test_rejected_files_objects_are_deleted_like_trained_ones(orch):
    """A rejected file's object stays for the dashboard while keep_trained_steps versions
    are published after its policy, then goes; its record stays in the ledger. One
    rejected after that is deleted at once."""
    o = orch("orchestrator.keep_trained_steps=2", "trainer.batch_groups=1000")
    w = o.worker("a")
    o.register(w)
    o.open_step(1, 0)
    g = [_file(o, w, 0, b"judged early"), _file(o, w, 0, b"judged late"), _file(o, w, 0, b"ok")]
    early = o.ok(o.validator, "POST", "/v1/validation/claim", {"max_policy": 0})["file"]
    o.ok(o.validator, "POST", "/v1/validation/verdict", _verdict(o, early, False, "error"))
    o.ok(o.trainer, "POST", "/v1/trainer/published", {"version": 1})
    assert o.svc.objects.size(early["key"]) is not None  # the viewer can still read it
    o.ok(o.trainer, "POST", "/v1/trainer/published", {"version": 2})
    assert o.svc.objects.size(early["key"]) is None
    late = o.ok(o.validator, "POST", "/v1/validation/claim", {"max_policy": 0})["file"]
    o.ok(o.validator, "POST", "/v1/validation/verdict", _verdict(o, late, False, "error"))
    assert o.svc.objects.size(late["key"]) is None
    # accepted, then refused by the trainer (a bad read) after the window: deleted at once
    ok = o.ok(o.validator, "POST", "/v1/validation/claim", {"max_policy": 0})["file"]
    assert {early["key"], late["key"], ok["key"]} == {x["key"] for x in g}
    o.ok(o.validator, "POST", "/v1/validation/verdict", _verdict(o, ok, True))
    assert o.svc.objects.size(ok["key"]) is not None
    o.ok(o.trainer, "POST", "/v1/trainer/reject", {"key": ok["key"], "reason": "unreadable"})
    assert o.svc.objects.size(ok["key"]) is None
    assert o.ledger()[public_key_hex(w)]["rejected"] == 3


def test_forged_or_foreign_verdicts_are_refused(orch):
    o = orch()
    w = o.worker("a")
    o.register(w)
    o.open_step(1, 0)
    _file(o, w, 0, b"some file")
    f = o.ok(o.validator, "POST", "/v1/validation/claim", {"max_policy": 0})["file"]
    body = _verdict(o, f, True)
    body["verdict"]["reason"] = "edited after signing"
    assert o.call(o.validator, "POST", "/v1/validation/verdict", body).status_code == 403
    other = dataclasses.asdict(
        Verdict(f["key"], "0" * 64, f["node"], 1, 0, True).signed(o.validator)
    )
    assert (
        o.call(o.validator, "POST", "/v1/validation/verdict", {"verdict": other}).status_code == 409
    )
    assert o.ledger()[public_key_hex(w)]["pending"] == 1


def test_a_cheat_found_after_its_file_went_stale_is_still_punished(orch):
    """The validator rejects a file the trainer has moved past (stale): the file stays
    stale, but its node is ejected and slashed all the same; an `error` verdict or an
    acceptance that late changes nothing."""
    o = orch()
    w, h = o.worker("cheat"), o.worker("honest")
    o.register(w), o.register(h)
    o.open_step(1, 0)
    _file(o, w, 0, b"cheated")
    _file(o, h, 0, b"honest but slow to judge")
    files = [o.ok(o.validator, "POST", "/v1/validation/claim", {"max_policy": 0})["file"]
             for _ in range(2)]  # fmt: skip
    o.open_step(1 + o.cfg.async_level + 1, 0)
    o.ok(o.trainer, "GET", "/v1/trainer/files", params={"step": 1 + o.cfg.async_level + 1})
    by = {f["node"]: f for f in files}
    late = o.ok(o.validator, "POST", "/v1/validation/verdict",
                _verdict(o, by[public_key_hex(w)], False, check="sampling"))  # fmt: skip
    assert late == {"state": "stale", "ejected": True}
    error = _verdict(o, by[public_key_hex(h)], False, check="error")
    assert o.ok(o.validator, "POST", "/v1/validation/verdict", error) == {"state": "stale"}
    ledger = o.ledger()
    assert ledger[public_key_hex(w)]["state"] == "ejected"
    assert ledger[public_key_hex(w)]["slashed"] == 100.0
    assert ledger[public_key_hex(h)]["state"] != "ejected"


def test_validator_that_dies_loses_its_lease(orch):
    o = orch("orchestrator.validation_lease_s=30")
    w = o.worker("a")
    o.register(w)
    o.open_step(1, 0)
    _file(o, w, 0, b"judge me")
    first = o.ok(o.validator, "POST", "/v1/validation/claim", {"max_policy": 0})["file"]
    assert o.ok(o.validator, "POST", "/v1/validation/claim", {"max_policy": 0})["file"] is None
    o.clock.t += 31
    again = o.ok(o.validator, "POST", "/v1/validation/claim", {"max_policy": 0})["file"]
    assert again["key"] == first["key"]


def test_state_survives_a_restart(orch):
    o = orch()
    w = o.worker("a")
    o.register(w)
    o.open_step(1, 0)
    g = _file(o, w, 0, b"durable")
    run_id = o.svc.run_id
    o.restart()
    assert o.svc.run_id == run_id
    assert o.ledger()[public_key_hex(w)]["pending"] == 1
    f = o.ok(o.validator, "POST", "/v1/validation/claim", {"max_policy": 0})["file"]
    assert f["key"] == g["key"]
    assert o.http.get(f["url"].removeprefix("http://testserver")).content == b"durable"


def test_length_budget_and_requirements_follow_the_measured_speed(orch):
    o = orch("orchestrator.file_seconds=10", "orchestrator.min_tokens_per_s=5")
    fast, slow, weak = o.worker("fast"), o.worker("slow"), o.worker("weak")
    assert o.register(fast, HW | {"tokens_per_s": 1e4})["max_new_tokens"] == 16
    # 64 samples per file, 10 s: 40 tokens/s fills 6 tokens per sample, floor 8
    assert o.register(slow, HW | {"tokens_per_s": 40.0})["max_new_tokens"] == 8
    r = o.call(
        weak,
        "POST",
        "/v1/nodes/register",
        {"role": "worker", "hardware": HW | {"tokens_per_s": 1.0}},
    )
    assert r.status_code == 403 and "tokens/s" in r.json()["detail"]
    o.open_step(1, 0)
    assert o.assignment(slow, 0)["assignment"]["max_new_tokens"] == 8


def test_spot_checks_send_a_fraction_to_validators(orch):
    o = orch("validator.sample_rate=0.5", "trainer.batch_groups=10000")
    w = o.worker("a")
    o.register(w)
    o.open_step(1, 0)
    for i in range(60):
        _file(o, w, 0, b"file %d" % i)
    files = o.ok(o.trainer, "GET", "/v1/trainer/files", params={"step": 1})["files"]
    unchecked = [f for f in files if not f["checked"]]
    assert 10 <= len(unchecked) <= 50  # 60 draws at 1/2: outside this range ~1e-5
    assert all(f["verdict"] is None for f in unchecked)


def test_relays_reported_by_several_contributors_stop_being_advertised(orch):
    o = orch("orchestrator.relay_reports=2", 'shardcast.servers=["http://127.0.0.1:9"]',
             "trainer.batch_groups=1000", 'orchestrator.relay_networks=["127.0.0.0/8"]')  # fmt: skip
    server = honest_relay(o.tmp, o.trainer, versions=(0,))
    relay = o.worker("relay")
    o.ok(relay, "POST", "/v1/nodes/register", {"role": "relay", "url": server.url})
    o.open_step(1, 0)
    assert RelayChecker(o.svc).run_due()[server.url].kind == "verified"  # relaycheck.py
    server.stop()  # not checked again here: the reports alone drop it below
    both = ["http://127.0.0.1:9", server.url]
    assert o.http.get("/v1/run").json()["servers"] == both
    a, b = o.worker("a"), o.worker("b")
    o.register(a), o.register(b)
    report = {"url": server.url, "what": "bad shard"}
    for k in (a, b):  # fresh keys cost nothing: their reports do not count
        assert not o.ok(k, "POST", "/v1/relays/report", report)["counted"]
    assert o.http.get("/v1/run").json()["servers"] == both
    for k, data in ((a, b"from a"), (b, b"from b")):
        _file(o, k, 0, data)
        f = o.ok(o.validator, "POST", "/v1/validation/claim", {"max_policy": 0})["file"]
        o.ok(o.validator, "POST", "/v1/validation/verdict", _verdict(o, f, True))
    for k in (a, a, b):
        assert o.ok(k, "POST", "/v1/relays/report", report)["counted"]
    assert o.http.get("/v1/run").json()["servers"] == ["http://127.0.0.1:9"]
    for k in (a, b):  # the operator's own servers are never dropped by reports
        o.ok(k, "POST", "/v1/relays/report", {"url": "http://127.0.0.1:9", "what": "x"})
    assert o.http.get("/v1/run").json()["servers"] == ["http://127.0.0.1:9"]


def test_a_node_cannot_redraw_its_prompts(orch):
    """Asking again, or with another policy version, gives the same counter and seed."""
    o = orch()
    w = o.worker("a")
    o.register(w)
    o.open_step(3, 2)
    first = o.assignment(w, 2)["assignment"]
    o.open_step(3, 2)
    for policy in (1, 2, 1, 2):
        again = o.assignment(w, policy)["assignment"]
        assert (again["counter"], again["seed"]) == (first["counter"], first["seed"])
        assert again["policy_step"] == policy
    o.open_step(5, 4)  # the trainer moved past the assignment's step while the node was away
    moved = o.assignment(w, 4)["assignment"]
    assert moved["step"] == 5 and moved["counter"] != first["counter"] and moved["policy_step"] == 4


def test_concurrent_heartbeats_get_distinct_counters_and_bounded_work(orch):
    """Requests run side by side (a thread pool; on PostgreSQL a pool of
    connections): every assignment gets its own counter, nothing fails, and the
    work handed out stays within the limit (plus, where transactions overlap,
    one file per request in flight)."""
    from concurrent.futures import ThreadPoolExecutor

    from swarmrl.orchestrator import work

    threads = 8
    o = orch("trainer.batch_groups=16", "worker.groups_per_file=4", "orchestrator.margin_groups=0")
    keys = [o.worker(f"w{i}") for i in range(2 * threads)]
    for k in keys:
        o.register(k)
    o.open_step(1, 0)
    with ThreadPoolExecutor(threads) as pool:
        answers = list(pool.map(lambda k: work.heartbeat(o.svc, public_key_hex(k), 0, True), keys))
    counters = [a["assignment"]["counter"] for a in answers if a["assignment"]]
    waits = [a["wait"] for a in answers if not a["assignment"]]
    assert len(set(counters)) == len(counters) >= 4
    assert set(waits) <= {"enough-work"} and len(counters) + len(waits) == len(keys)
    overshoot = 0 if o.svc.db.engine == "sqlite" else threads - 1
    assert len(counters) <= 16 // 4 + overshoot


def test_postgres_connections_that_die_are_replaced(orch, request):
    """A PostgreSQL restart or a killed backend: the request that held the dead
    connection fails (a 5xx, which clients retry), the next ones get fresh
    connections, and nothing recorded is lost."""
    if request.node.callspec.params["orch"] != "postgres":
        pytest.skip("a PostgreSQL connection pool")
    import psycopg

    o = orch()
    w = o.worker("a")
    o.register(w)
    o.open_step(1, 0)
    counter = o.assignment(w, 0)["assignment"]["counter"]
    dbname = o.cfg.orchestrator.database.rsplit("/", 1)[1]
    with psycopg.connect(o.cfg.orchestrator.database, autocommit=True) as admin:
        killed = admin.execute(
            "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            (dbname,),
        ).fetchone()[0]
    assert killed == len(o.svc.db.conns) >= 1
    failures = 0
    for _ in range(killed + 1):
        try:
            o.call(w, "POST", "/v1/nodes/heartbeat", {"want_work": False})
            break
        except psycopg.OperationalError:
            failures += 1
    assert 1 <= failures <= killed
    assert o.assignment(w, 0)["assignment"]["counter"] == counter  # recorded work survived


@pytest.mark.parametrize(
    "overrides, held, wait",
    [
        (("async_level=2",), 1, "stale-policy"),  # one version behind the newest: waits
        (("async_level=2",), 2, None),
        (("async_level=2", "orchestrator.work_slack_steps=0"), 1, None),
        (("async_level=1",), 2, None),  # never fewer than one usable step
    ],
)
def test_new_work_needs_a_step_of_slack_before_staleness(orch, overrides, held, wait):
    """The rule before pipelining (orchestrator.assign = "slack"; the pipelined rule:
    test_orchestrator_pipeline.py): at async_level 2, a node holding policy step - 2 (one
    version behind the newest) waits for the newer one. With work_slack_steps=0 it gets
    work."""
    o = orch("orchestrator.assign=slack", *overrides)
    node = o.worker("n")
    o.register(node)
    o.open_step(3, 2)  # collecting for step 3; version 2 published
    answer = o.assignment(node, held)
    assert answer["wait"] == wait
    if wait is None:
        assert answer["assignment"]["policy_step"] == held
