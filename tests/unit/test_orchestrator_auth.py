"""Signed requests, roles, the operator token and bad bodies: refused, and nothing changes."""

from __future__ import annotations

import json

import pytest

from swarmrl.protocol.signing import sign_request
from tests.unit.orch_util import Orch, pubhex


@pytest.fixture
def orch(tmp_path):
    return Orch(tmp_path)


def _signed(orch, key, method, path, body: bytes, **change):
    req = orch.http.build_request(method, path, content=body)
    h = sign_request(
        key, orch.svc.run_id, method, req.url.raw_path.decode(), body, now=orch.clock()
    )
    h.update(change)
    req.headers.update(h)
    req.headers["content-type"] = "application/json"
    return req


def test_each_signature_failure_is_401_and_changes_nothing(orch):
    w = orch.worker("a")
    body = json.dumps(
        {"role": "worker", "hardware": {"cpus": 2, "memory_gb": 8, "tokens_per_s": 9}}
    )
    before = orch.snapshot()
    cases = {}
    req = orch.http.build_request("POST", "/v1/nodes/register", content=body.encode())
    cases["unsigned"] = req
    cases["bad signature"] = _signed(orch, w, "POST", "/v1/nodes/register", body.encode(),
                                     **{"X-Swarm-Signature": "00" * 64})  # fmt: skip
    stale = _signed(orch, w, "POST", "/v1/nodes/register", body.encode())
    orch.clock.t += 120  # the window is 60 s
    cases["stale timestamp"] = stale
    fut = orch.clock.t
    orch.clock.t -= 120
    cases["future timestamp"] = _signed(orch, w, "POST", "/v1/nodes/register", body.encode())
    orch.clock.t = fut
    tampered = _signed(orch, w, "POST", "/v1/nodes/register", body.encode())
    tampered.stream = None
    cases["tampered body"] = orch.http.build_request(
        "POST", "/v1/nodes/register", content=body.replace('"cpus": 2', '"cpus": 64').encode(),
        headers={k: v for k, v in tampered.headers.items() if k.lower().startswith("x-swarm")},
    )  # fmt: skip
    q = _signed(orch, orch.trainer, "GET", "/v1/trainer/files?step=1", b"")
    cases["tampered query"] = orch.http.build_request(
        "GET", "/v1/trainer/files?step=2",
        headers={k: v for k, v in q.headers.items() if k.lower().startswith("x-swarm")},
    )  # fmt: skip
    other_run = orch.http.build_request("POST", "/v1/nodes/register", content=body.encode())
    other_run.headers.update(
        sign_request(
            w, "another-run", "POST", "/v1/nodes/register", body.encode(), now=orch.clock()
        )
    )
    cases["another run's signature"] = other_run
    cases["malformed key"] = _signed(orch, w, "POST", "/v1/nodes/register", body.encode(),
                                     **{"X-Swarm-Key": "zz" * 32})  # fmt: skip
    for what, req in cases.items():
        r = orch.http.send(req)
        assert r.status_code == 401, (what, r.status_code, r.text)
    assert orch.snapshot() == before
    ok = _signed(orch, w, "POST", "/v1/nodes/register", body.encode())
    assert orch.http.send(ok).status_code == 200
    replayed = orch.http.send(ok)  # the same request again: its nonce is spent
    assert replayed.status_code == 401 and "nonce" in replayed.json()["detail"]


def test_roles_a_worker_cannot_call_trainer_or_validator_endpoints(orch):
    w = orch.worker("a")
    orch.register(w)
    before = orch.snapshot()
    for method, path, body in [
        ("POST", "/v1/trainer/step", {"step": 3}),
        ("POST", "/v1/trainer/published", {"version": 3}),
        ("GET", "/v1/trainer/files?step=1", None),
        ("POST", "/v1/trainer/consume", {"step": 1, "keys": []}),
        ("POST", "/v1/trainer/resume", {"version": 0}),
        ("POST", "/v1/validation/claim", {}),
    ]:
        r = orch.call(w, method, path, body)
        assert r.status_code == 403, (path, r.status_code, r.text)
    assert orch.call(orch.validator, "POST", "/v1/trainer/step", {"step": 3}).status_code == 403
    assert orch.snapshot() == before


def test_operator_endpoints_need_the_bearer_token(orch):
    w = orch.worker("a")
    orch.register(w)
    key = orch.ledger().popitem()[0]
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": orch.token}):
        r = orch.http.post(f"/v1/admin/nodes/{key}/ban", headers=headers)
        assert r.status_code == 401
    assert orch.ledger()[key]["state"] == "registered"
    auth = {"Authorization": f"Bearer {orch.token}"}
    assert orch.http.post(f"/v1/admin/nodes/{key}/ban", headers=auth).status_code == 200
    assert orch.ledger()[key]["state"] == "banned"
    r = orch.call(w, "POST", "/v1/nodes/heartbeat", {"want_work": True})
    assert r.status_code == 403 and "banned" in r.json()["detail"]
    assert orch.http.post(f"/v1/admin/nodes/{key}/unban", headers=auth).status_code == 200
    assert orch.register(w)["state"] == "registered"
    r = orch.http.post("/v1/admin/run", headers=auth, json={"paused": True})
    assert r.status_code == 200 and r.json()["paused"]


def test_bad_bodies_are_4xx_never_5xx(orch):
    w = orch.worker("a")
    cases = [
        ("POST", "/v1/nodes/register", b"not json"),
        ("POST", "/v1/nodes/register", b'{"role": "boss"}'),
        ("POST", "/v1/nodes/register", b'{"role": "worker", "hardware": {"cpus": "many"}}'),
        ("POST", "/v1/nodes/register", b'{"role": "worker"}'),
        ("POST", "/v1/nodes/register", b'{"role": "relay", "url": "file:///etc/passwd"}'),
        ("POST", "/v1/nodes/heartbeat", b'{"policy_version": -4}'),
        ("POST", "/v1/uploads", b'{"counter": 1, "size": 10, "sha256": "xyz"}'),
        ("POST", "/v1/nodes/register", b"[" * 100_000),
        ("POST", "/v1/nodes/register", b'{"role": "worker", "pad": "' + b"x" * (2 << 20) + b'"}'),
    ]
    for method, path, raw in cases:
        r = orch.call(w, method, path, raw=raw)
        assert 400 <= r.status_code < 500, (path, raw[:60], r.status_code, r.text[:200])
    big = orch.call(w, "POST", "/v1/nodes/register", raw=b" " * (2 << 20))
    assert big.status_code == 413
    assert orch.ledger() == {}


# Who may call each signed route. Everyone else gets 403 and changes nothing; the
# operator's routes take no signature at all (the bearer token: above).
MAY_CALL = {
    ("POST", "/v1/nodes/register"): {"stranger", "worker", "relay"},
    ("POST", "/v1/nodes/heartbeat"): {"worker"},  # asking for work; a relay may beat without
    ("POST", "/v1/uploads"): {"worker"},
    ("POST", "/v1/submit"): {"worker"},
    ("POST", "/v1/relays/report"): {"worker", "relay", "validator"},
    ("POST", "/v1/validation/claim"): {"validator"},
    ("POST", "/v1/validation/verdict"): {"validator"},
    ("POST", "/v1/trainer/step"): {"trainer"},
    ("POST", "/v1/trainer/published"): {"trainer"},
    ("GET", "/v1/trainer/files"): {"trainer"},
    ("POST", "/v1/trainer/consume"): {"trainer"},
    ("POST", "/v1/trainer/reject"): {"trainer"},
    ("POST", "/v1/trainer/mismatch"): {"trainer"},
    ("POST", "/v1/trainer/metrics"): {"trainer"},
    ("POST", "/v1/trainer/resume"): {"trainer"},
}


def test_every_signed_route_admits_only_its_roles(tmp_path):
    """Every signed route of the OpenAPI document x every kind of caller (a key never
    registered, a worker, a relay, a banned worker, the validator, the trainer), with
    a well-formed body: a caller the table does not list gets 403 and the database does
    not change; a listed caller gets past the checks of who it is (no 401 or 403)."""
    o = Orch(tmp_path, 'orchestrator.relay_networks=["127.0.0.0/8"]')
    o.open_step(0, 0)
    doc = o.http.get("/openapi.json").json()
    signed = {
        (m.upper(), p)
        for p, ops in doc["paths"].items()
        for m, op in ops.items()
        if {"signed": []} in op.get("security", [])
    }
    assert signed == set(MAY_CALL), "a signed route without its row in MAY_CALL, or a stale row"

    worker = o.worker("w")
    o.register(worker)
    relay = o.worker("r")
    o.ok(relay, "POST", "/v1/nodes/register", {"role": "relay", "url": "http://127.0.0.1:9"})
    banned = o.worker("x")
    o.register(banned)
    auth = {"Authorization": f"Bearer {o.token}"}
    assert o.http.post(f"/v1/admin/nodes/{pubhex(banned)}/ban", headers=auth).status_code == 200

    counter = o.assignment(worker, 0)["assignment"]["counter"]
    grant = o.ok(worker, "POST", "/v1/uploads", {"counter": counter, "size": 4, "sha256": "a" * 64})
    hardware = {"cpus": 2, "memory_gb": 8.0, "tokens_per_s": 500.0}
    bodies = {
        "/v1/nodes/register": {"role": "worker", "hardware": hardware},
        "/v1/nodes/heartbeat": {"policy_version": 0, "want_work": True},
        "/v1/uploads": {"counter": counter, "size": 4, "sha256": "a" * 64},
        "/v1/submit": {"key": grant["key"], "sha256": "a" * 64},
        "/v1/relays/report": {"url": "http://127.0.0.1:9", "what": "slow"},
        "/v1/validation/claim": {},
        "/v1/validation/verdict": {"verdict": {"key": "k", "sha256": "0" * 64, "node": "n"}},
        "/v1/trainer/step": {"step": 0},
        "/v1/trainer/published": {"version": 0},
        "/v1/trainer/files": None,
        "/v1/trainer/consume": {"step": 0, "keys": []},
        "/v1/trainer/reject": {"key": "k", "reason": "r"},
        "/v1/trainer/mismatch": {"step": 0, "nodes": []},
        "/v1/trainer/metrics": {"step": 0, "row": {"step": 0, "reward": 0.5}},
        "/v1/trainer/resume": {"version": 0},
    }
    callers = {
        "worker": worker,
        "relay": relay,
        "banned": banned,
        "validator": o.validator,
        "trainer": o.trainer,
    }
    for method, path in sorted(MAY_CALL):
        for name in ["stranger", *callers]:
            key = o.worker(f"stranger-{path}") if name == "stranger" else callers[name]
            target = path + ("?step=0" if method == "GET" else "")
            before = o.snapshot()
            r = o.call(key, method, target, bodies[path])
            what = (method, path, name, r.status_code, r.text[:200])
            if name in MAY_CALL[method, path]:
                assert r.status_code not in (401, 403), what
            else:
                assert r.status_code == 403, what
                assert o.snapshot() == before, what
    o.svc.db.close()
