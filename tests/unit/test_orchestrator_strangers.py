"""No state from strangers: a key the orchestrator does not know leaves nothing behind
(no nonce, no in-memory entry, no row), and every per-key table it keeps in memory is
bounded (orchestrator/service.py: `Recent`)."""

from __future__ import annotations

from itertools import count

from nacl.signing import SigningKey

from swarmrl.orchestrator.service import MAX_TRACKED, Recent
from swarmrl.protocol import work_proof
from tests.unit.orch_util import HW, Orch, pubhex


def _nonces(o: Orch) -> int:
    return o.svc.db.one("SELECT COUNT(*) FROM nonces")[0][0]


def test_1500_heartbeats_from_unregistered_keys_leave_nothing(tmp_path):
    o = Orch(tmp_path, "orchestrator.register_work_bits=8")
    o.open_step(1, 0)
    before, nonces = o.snapshot(), _nonces(o)
    for i in range(1500):
        stranger = SigningKey(bytes([i % 256, i // 256]) + bytes(30))
        r = o.call(stranger, "POST", "/v1/nodes/heartbeat", {"policy_version": 0})
        assert r.status_code == 403 and "not registered" in r.json()["detail"]
    assert len(o.svc.node_versions) == 0 and len(o.svc.asked_work) == 0
    assert _nonces(o) == nonces and o.snapshot() == before
    # nor do other calls of theirs: reports, uploads, a registration they cannot pay for
    stranger = o.worker("stranger")
    # a nonce that does not pay for this (random) key: "1" alone did one time in 256
    unpaid = next(
        str(n) for n in count(1) if not work_proof.check(o.svc.run_id, pubhex(stranger), str(n), 8)
    )
    calls = [
        ("/v1/relays/report", {"url": "http://127.0.0.1:9"}),
        ("/v1/uploads", {"counter": 1, "size": 10, "sha256": "0" * 64}),
        ("/v1/nodes/register", {"role": "worker", "hardware": HW, "work": unpaid}),
    ]
    for path, body in calls:
        assert o.call(stranger, "POST", path, body).status_code == 403, path
    assert _nonces(o) == nonces and o.snapshot() == before
    assert o.svc.db.one("SELECT COUNT(*) FROM relay_reports")[0][0] == 0


def test_a_registration_records_its_nonce_with_it(tmp_path):
    o = Orch(tmp_path)
    w = o.worker("w")
    body = {"role": "worker", "hardware": HW}
    import json

    from swarmrl.protocol.signing import sign_request

    content = json.dumps(body).encode()
    headers = sign_request(w, o.svc.run_id, "POST", "/v1/nodes/register", content, now=o.clock())
    headers["content-type"] = "application/json"
    first = o.http.post("/v1/nodes/register", content=content, headers=headers)
    assert first.status_code == 200
    again = o.http.post("/v1/nodes/register", content=content, headers=headers)
    assert again.status_code == 401 and "nonce" in again.json()["detail"]
    assert o.svc.db.one("SELECT COUNT(*) FROM nonces WHERE key = ?", (pubhex(w),))[0][0] == 1


def test_every_in_memory_table_is_bounded_and_keeps_the_newest():
    table = Recent(100)
    for i in range(10_000):
        table[f"k{i}"] = i
    assert len(table) == 100 and min(table.values()) == 9_900
    table["k9900"] = -1  # set again: the newest now
    table["new"] = 0
    assert "k9900" in table and "k9901" not in table
    assert table.pop("new") == 0 and table.pop("gone", None) is None


def test_the_services_tables_are_bounded_by_registered_nodes(tmp_path):
    o = Orch(tmp_path)
    for name in ("upload_times", "asked_work", "node_versions", "published_at"):
        assert isinstance(getattr(o.svc, name), Recent), name
    assert o.svc.node_versions.size == MAX_TRACKED
    o.svc.node_versions.size = 50  # flood past a small bound with registered nodes
    o.open_step(1, 0)
    keys = [o.worker(f"w{i}") for i in range(120)]
    for k in keys:
        o.register(k)
        o.ok(k, "POST", "/v1/nodes/heartbeat", {"policy_version": 0})
    assert len(o.svc.node_versions) == 50
    assert pubhex(keys[-1]) in o.svc.node_versions and pubhex(keys[0]) not in o.svc.node_versions
