"""Admission a sybil swarm cannot monopolise (orchestrator/admission.py, ranges.py): the
faucet and the probation pool are shared per address range, the proof of work is priced
in seconds of one core, and blameless refusals far above the swarm's count against a
node."""

from __future__ import annotations

import dataclasses

import pytest

from swarmrl.orchestrator import admission, judgement
from swarmrl.orchestrator.ranges import address_range
from swarmrl.orchestrator.service import ApiError
from swarmrl.protocol import work_proof
from swarmrl.protocol.verdict import Verdict
from tests.unit.orch_util import HW, Orch, pubhex

SYBILS = "203.0.113.7"  # one /24
NEWCOMER = "198.51.100.20"  # another


@pytest.mark.parametrize(
    ("host", "net"),
    [
        ("203.0.113.7", "203.0.113.0/24"),
        ("203.0.113.250", "203.0.113.0/24"),
        ("::ffff:203.0.113.9", "203.0.113.0/24"),
        ("2001:db8:1:2:3::4", "2001:db8:1::/48"),
        ("2001:db8:1:ffff::1", "2001:db8:1::/48"),
        ("127.0.0.2", "127.0.0.2/32"),  # each loopback address alone
        ("::1", "::1/128"),
        ("testclient", "testclient"),
    ],
)
def test_address_ranges(host, net):
    assert address_range(host) == net


def test_one_range_takes_its_share_of_the_faucet_and_a_newcomer_elsewhere_gets_in(tmp_path):
    o = Orch(tmp_path, "orchestrator.faucet_burst=6", "orchestrator.faucet_per_hour=60",
             "orchestrator.range_share=0.5")  # fmt: skip
    sybils = o.at(SYBILS)
    answers = [sybils.call(o.worker(f"s{i}"), "POST", "/v1/nodes/register",
                           {"role": "worker", "hardware": HW}) for i in range(5)]  # fmt: skip
    assert [a.status_code for a in answers] == [200, 200, 200, 429, 429]
    refused = answers[3]
    assert "address range 203.0.113.0/24" in refused.json()["detail"]
    assert int(refused.headers["Retry-After"]) == 120  # its share refills at 30 an hour
    newcomer = o.at(NEWCOMER).call(o.worker("honest"), "POST", "/v1/nodes/register",
                                   {"role": "worker", "hardware": HW})  # fmt: skip
    assert newcomer.status_code == 200 and newcomer.json()["stake"] == 100.0
    # after two minutes the range has one stake again
    o.clock.t += 121
    r = sybils.call(
        o.worker("s9"), "POST", "/v1/nodes/register", {"role": "worker", "hardware": HW}
    )
    assert r.status_code == 200


def _verdict(o: Orch, f: dict, accepted: bool = True, check: str = "") -> dict:
    v = Verdict(f["key"], f["sha256"], f["node"], f["assignment"]["step"],
                f["assignment"]["policy_step"], accepted, check=check,
                reason="" if accepted else "the tool's time limit")  # fmt: skip
    return {"verdict": dataclasses.asdict(v.signed(o.validator))}


def test_one_range_holds_its_share_of_the_probation_pool(tmp_path):
    """Ten sybil keys from one range fill half of a pool of four files; an honest newcomer
    from another range gets an assignment at once."""
    o = Orch(tmp_path, "orchestrator.probation_files=2", "orchestrator.probation_groups=32",
             "worker.groups_per_file=8", "orchestrator.range_share=0.5")  # fmt: skip
    o.open_step(1, 0)
    sybils = o.at(SYBILS)
    keys = [o.worker(f"s{i}") for i in range(10)]
    waits = []
    for k in keys:
        sybils.register(k)
        hb = sybils.ok(k, "POST", "/v1/nodes/heartbeat", {"policy_version": 0, "want_work": True})
        waits.append(hb["wait"])
    assert waits[:2] == [None, None] and set(waits[2:]) == {"range-share"}
    newcomer = o.at(NEWCOMER)
    honest = o.worker("honest")
    newcomer.register(honest)
    hb = newcomer.ok(
        honest, "POST", "/v1/nodes/heartbeat", {"policy_version": 0, "want_work": True}
    )
    assert hb["assignment"] is not None
    # on e137014's rule (one pool for all) the sybils would have taken all four files first
    with o.svc.db.tx() as cur:
        assert admission.outstanding(o.svc, cur, 0, True, "203.0.113.0/24") == 16


def test_the_proof_of_work_is_priced_in_seconds_of_one_core(tmp_path):
    o = Orch(tmp_path, "orchestrator.register_work_s=0.01")
    o.cfg.orchestrator.register_work_bits = None  # Orch sets 0; this test prices it
    o.restart()
    bits = o.svc.work_bits
    rate = work_proof.hashes_per_second()
    assert abs(bits - work_proof.bits_for(0.01, rate)) <= 1  # measured here, give or take
    assert o.http.get("/v1/run").json()["register_work_bits"] == bits
    assert o.svc.meta("register_work_bits:0.01") == str(bits)
    o.restart()
    assert o.svc.work_bits == bits  # kept: restarts and replicas agree
    w = o.worker("w")
    weak = work_proof.solve(o.svc.run_id, pubhex(w), max(0, bits - 6))
    if not work_proof.check(o.svc.run_id, pubhex(w), weak, bits):
        body = {"role": "worker", "hardware": HW, "work": weak}
        assert o.call(w, "POST", "/v1/nodes/register", body).status_code == 403
    body = {
        "role": "worker",
        "hardware": HW,
        "work": work_proof.solve(o.svc.run_id, pubhex(w), bits),
    }
    assert o.call(w, "POST", "/v1/nodes/register", body).status_code == 200


def test_judged_counts_fade_so_the_rates_are_recent_ones(tmp_path):
    o = Orch(tmp_path)
    node = "ab" * 32
    with o.svc.db.tx() as cur:
        for _ in range(judgement.JUDGED_WINDOW - 1):
            judgement.record_judgement(o.svc, cur, node, False, 0.0)
        judgement.record_judgement(o.svc, cur, node, True, 0.0)
    judged, blameless = o.svc.db.one("SELECT judged, blameless FROM standing")[0]
    assert (judged, blameless) == (judgement.JUDGED_WINDOW // 2, 0)  # 1 // 2
    swarm = dict(o.svc.db.one("SELECT name, value FROM counters WHERE name LIKE '%_files'"))
    assert swarm == {"judged_files": judgement.JUDGED_WINDOW, "blameless_files": 1}
    with o.svc.db.tx() as cur:
        cur.execute("UPDATE counters SET value = ? WHERE name = 'judged_files'",
                    (judgement.SWARM_WINDOW - 1,))  # fmt: skip
        cur.execute("UPDATE counters SET value = 301 WHERE name = 'blameless_files'")
        judgement.record_judgement(o.svc, cur, node, True, 0.0)
    swarm = dict(o.svc.db.one("SELECT name, value FROM counters WHERE name LIKE '%_files'"))
    assert swarm == {"judged_files": judgement.SWARM_WINDOW // 2, "blameless_files": 151}


def test_blameless_refusals_far_above_the_swarms_send_a_node_back_to_probation(tmp_path):
    o = Orch(tmp_path, "orchestrator.probation_files=1", "trainer.batch_groups=1000",
             "orchestrator.blameless_min=3", "orchestrator.blameless_factor=4")  # fmt: skip
    o.open_step(1, 0)
    honest, forger = o.worker("honest"), o.worker("forger")
    o.register(honest), o.register(forger)

    def file(key, payload: bytes, accepted: bool = True, check: str = "unverifiable") -> dict:
        a = o.assignment(key, 0)
        assert a["assignment"] is not None, a["wait"]
        o.upload(key, a["assignment"]["counter"], payload)
        f = o.ok(o.validator, "POST", "/v1/validation/claim", {"max_policy": 0})["file"]
        check = "" if accepted else check
        return o.ok(o.validator, "POST", "/v1/validation/verdict", _verdict(o, f, accepted, check))

    for i in range(40):  # the swarm's files: all accepted
        file(honest, b"honest %d" % i)
    file(forger, b"forger 0")  # proven
    # three blameless refusals in four files, far above the swarm's 0: a file that makes
    # the validator fail counts as one it cannot settle (either could be made on purpose)
    for i, check in enumerate(("unverifiable", "error")):
        file(forger, b"forger %s %d" % (check.encode(), i), accepted=False, check=check)
    with o.svc.db.tx() as cur:
        assert not admission.on_probation(o.svc, cur, pubhex(forger))
    file(forger, b"forger unverifiable 2", accepted=False)
    with o.svc.db.tx() as cur:
        assert admission.on_probation(o.svc, cur, pubhex(forger))
        assert admission.cooldown_left(o.svc, cur, pubhex(forger), o.clock()) > 0
    assert o.assignment(forger, 0)["wait"] == "cooldown"
    events = o.http.get("/v1/dashboard/verdicts").json()["events"]
    assert any(e["kind"] == "probation" and e["node"] == pubhex(forger) for e in events)
    # one blameless refusal among many files is the swarm's rate, and costs nothing
    file(honest, b"honest unverifiable", accepted=False)
    with o.svc.db.tx() as cur:
        assert not admission.on_probation(o.svc, cur, pubhex(honest))
    assert o.assignment(honest, 0)["assignment"] is not None


def test_many_keys_refused_without_blame_cannot_raise_the_swarms_rate(tmp_path):
    """An attacker with most of the swarm's keys, each sending only files that cannot be
    settled: the swarm's rate is then theirs (9 in 10 files), but it is held at
    BLAMELESS_CEILING, so every one of them still goes back to probation."""
    o = Orch(tmp_path)
    with o.svc.db.tx() as cur:
        sent = []
        for i in range(50):  # 5 honest nodes, 45 of the attacker's, 6 files each
            node = f"{i:064x}"
            for _ in range(6):
                sent.append(judgement.record_judgement(o.svc, cur, node, i >= 5, 0.0))
        swarm = dict(cur.execute("SELECT name, value FROM counters").fetchall())
        back = cur.execute("SELECT node FROM events WHERE kind = 'probation'").fetchall()
    back = [r[0] for r in back]
    assert swarm["blameless_files"] / swarm["judged_files"] > 0.5  # the swarm's own rate
    assert sorted(set(back)) == [f"{i:064x}" for i in range(5, 50)]  # every attacker's key
    assert sum(sent) == len(back)


def test_a_database_from_before_gains_the_new_columns(tmp_path):
    """A run's database made before address ranges, blameless counts and key-based relay
    reports opens with them added, its rows kept (reports, short-lived, start afresh)."""
    import sqlite3

    from swarmrl.orchestrator.db import SQLiteDatabase

    path = tmp_path / "state.sqlite"
    with sqlite3.connect(path) as old:
        old.execute(
            "CREATE TABLE nodes (key TEXT PRIMARY KEY, role TEXT NOT NULL, state TEXT NOT NULL,"
            " registered DOUBLE PRECISION NOT NULL, last_seen DOUBLE PRECISION NOT NULL,"
            " hardware TEXT NOT NULL, budget BIGINT NOT NULL, url TEXT NOT NULL,"
            " stake DOUBLE PRECISION NOT NULL, slashed DOUBLE PRECISION NOT NULL,"
            " reason TEXT NOT NULL)"
        )
        old.execute(
            "CREATE TABLE standing (node TEXT PRIMARY KEY, proven BIGINT NOT NULL,"
            " expired BIGINT NOT NULL, last_expired DOUBLE PRECISION NOT NULL)"
        )
        old.execute(
            "CREATE TABLE relay_reports (url TEXT NOT NULL, reporter TEXT NOT NULL,"
            " time DOUBLE PRECISION NOT NULL, what TEXT NOT NULL, PRIMARY KEY (url, reporter))"
        )
        old.execute("INSERT INTO nodes VALUES ('k', 'worker', 'healthy', 1, 2, '{}', 16, '',"
                    " 100, 0, '')")  # fmt: skip
        old.execute("INSERT INTO standing VALUES ('k', 2, 0, 0)")
        old.execute("INSERT INTO relay_reports VALUES ('http://x', 'k', 1, '')")
    db = SQLiteDatabase(path)
    try:
        assert db.one("SELECT key, stake, net, endpoints FROM nodes") == [("k", 100.0, "", "")]
        assert db.one("SELECT proven, judged, blameless FROM standing") == [(2, 0, 0)]
        assert db.one("SELECT COUNT(*) FROM relay_reports") == [(0,)]
    finally:
        db.close()


@pytest.mark.parametrize("role", ["worker", "relay"])
def test_concurrent_registrations_take_no_more_than_the_share(orch, role):
    """Sixteen registrations at once from one range (on PostgreSQL, side by side on a
    pool of connections): the range shares of the faucet (4 of 8) and of the relays (3 of 6) hold
    exactly, as they do one at a time."""
    from concurrent.futures import ThreadPoolExecutor

    from swarmrl.orchestrator import nodes
    from swarmrl.orchestrator.auth import Caller

    o = orch("orchestrator.faucet_burst=8", "orchestrator.faucet_per_hour=1",
             "orchestrator.range_share=0.5", "orchestrator.max_relays=6")  # fmt: skip
    keys = [pubhex(o.worker(f"s{i}")) for i in range(16)]

    def register(i: int) -> int:
        caller = Caller(keys[i], f"nonce-{i:016d}", False, True, SYBILS)
        url = f"http://relay{i}.example:8000"
        try:
            nodes.register(o.svc, caller, role, HW if role == "worker" else {}, url,
                           places=[f"relay{i}.example:8000"])  # fmt: skip
        except ApiError as e:
            assert e.status == 429, e.detail
            return 0
        return 1

    with ThreadPoolExecutor(16) as pool:
        admitted = sum(pool.map(register, range(16)))
    assert admitted == (4 if role == "worker" else 3)


def test_callers_without_an_address_share_no_range(tmp_path):
    """A peer with no address (a Unix socket) is not lumped with every other such peer
    into one range holding half the faucet: only the run's own limits apply."""
    from swarmrl.orchestrator import nodes
    from swarmrl.orchestrator.auth import Caller

    o = Orch(tmp_path, "orchestrator.faucet_burst=4", "orchestrator.faucet_per_hour=1",
             "orchestrator.range_share=0.5")  # fmt: skip
    admitted = 0
    for i in range(6):
        caller = Caller(pubhex(o.worker(f"u{i}")), f"nonce-{i:016d}", False, True, "")
        try:
            nodes.register(o.svc, caller, "worker", HW, "")
            admitted += 1
        except ApiError as e:
            assert e.status == 429 and "range" not in e.detail
    assert admitted == 4
