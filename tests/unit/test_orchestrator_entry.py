"""What a new key pays to register (orchestrator/admission.py: admit): a proof of work
bound to the key and the run, a stake from the operator's faucet, or an invitation."""

from __future__ import annotations

import pytest

from swarmrl.protocol import work_proof
from tests.unit.orch_util import HW, Orch, pubhex

BITS = 10


def _register(o: Orch, key, **extra):
    return o.call(key, "POST", "/v1/nodes/register", {"role": "worker", "hardware": HW, **extra})


def test_proof_of_work_is_bound_to_the_key_and_the_run():
    nonce = work_proof.solve("run-a", "ab" * 32, 12)
    assert work_proof.check("run-a", "ab" * 32, nonce, 12)
    # the first nonce solving 12 bits for another key or run is almost never this one
    assert (
        work_proof.solve("run-a", "cd" * 32, 12) != nonce
        or work_proof.solve("run-b", "ab" * 32, 12) != nonce
    )
    for bad in ("", "x1", "¹²", "1" * 21, "-1", " 1"):
        assert not work_proof.check("run-a", "ab" * 32, bad, 1)
    assert work_proof.check("run-a", "ab" * 32, "", 0)  # 0 bits: no work asked
    with pytest.raises(ValueError):
        work_proof.solve("run-a", "ab" * 32, 41)


def test_a_new_key_registers_only_with_its_proof_of_work(tmp_path):
    o = Orch(tmp_path, f"orchestrator.register_work_bits={BITS}")
    w, other = o.worker("w"), o.worker("other")
    assert o.http.get("/v1/run").json()["register_work_bits"] == BITS
    r = _register(o, w)
    assert r.status_code == 403 and "proof of work" in r.json()["detail"]
    nonce_for_other = work_proof.solve(o.svc.run_id, pubhex(other), BITS)
    if not work_proof.check(o.svc.run_id, pubhex(w), nonce_for_other, BITS):
        assert _register(o, w, work=nonce_for_other).status_code == 403  # not its proof
    r = _register(o, w, work=work_proof.solve(o.svc.run_id, pubhex(w), BITS))
    assert r.status_code == 200, r.text
    assert r.json()["stake"] == o.cfg.orchestrator.stake
    assert _register(o, w).status_code == 200  # a known key registers again for nothing
    rows = o.svc.db.one("SELECT COUNT(*) FROM nodes")
    assert rows[0][0] == 1  # the refused attempts left nothing behind


def test_the_faucet_admits_so_many_new_workers_an_hour(tmp_path):
    o = Orch(tmp_path, "orchestrator.faucet_burst=3", "orchestrator.faucet_per_hour=60")
    keys = [o.worker(f"w{i}") for i in range(5)]
    for k in keys[:3]:
        assert _register(o, k).status_code == 200
    r = _register(o, keys[3])
    assert r.status_code == 429 and "retry in 60 s" in r.json()["detail"]
    assert r.headers["Retry-After"] == "60"
    o.clock.t += 61  # one more stake has dripped in
    assert _register(o, keys[3]).status_code == 200
    assert _register(o, keys[4]).status_code == 429
    relay = o.worker("relay")  # a relay holds no stake and takes none from the faucet
    r = o.call(relay, "POST", "/v1/nodes/register", {"role": "relay", "url": "http://1.1.1.1"})
    assert r.status_code == 200, r.text
    stakes = [n["stake"] for n in o.http.get("/v1/ledger").json()["nodes"]]
    assert sum(stakes) == 4 * o.cfg.orchestrator.stake


def test_invitations_admit_once_with_the_operators_deposit(tmp_path):
    o = Orch(tmp_path, "orchestrator.faucet_burst=0", f"orchestrator.register_work_bits={BITS}")
    assert o.http.get("/v1/run").json()["invitation_only"] is True
    w, v = o.worker("w"), o.worker("v")
    r = _register(o, w, work=work_proof.solve(o.svc.run_id, pubhex(w), BITS))
    assert r.status_code == 403 and "invitation" in r.json()["detail"]
    headers = {"Authorization": f"Bearer {o.svc.operator_token}"}
    assert o.http.post("/v1/admin/invites", json={"count": 2}).status_code == 401
    answer = o.http.post("/v1/admin/invites", json={"count": 2, "stake": 7.5}, headers=headers)
    assert answer.status_code == 200, answer.text
    first, second = answer.json()["invites"]
    r = _register(o, w, invite=first)  # no proof of work with an invitation
    assert r.status_code == 200 and r.json()["stake"] == 7.5
    r = _register(o, v, invite=first)
    assert r.status_code == 403 and "used" in r.json()["detail"]
    assert _register(o, v, invite=second + "x").status_code == 403
    assert _register(o, v, invite=second).status_code == 200
    stored = o.svc.db.one("SELECT hash FROM invites")
    assert first not in {h for (h,) in stored}  # only hashes are kept


def test_the_client_pays_the_proof_of_work_and_waits_for_the_faucet(tmp_path, monkeypatch):
    from swarmrl.protocol import client as client_module
    from swarmrl.protocol.client import OrchestratorClient

    o = Orch(tmp_path, f"orchestrator.register_work_bits={BITS}", "orchestrator.faucet_burst=1",
             "orchestrator.faucet_per_hour=3600")  # fmt: skip
    slept = []

    def sleep(s):  # the orchestrator's clock moves while the client waits
        slept.append(s)
        o.clock.t += s

    monkeypatch.setattr(client_module.time, "sleep", sleep)
    monkeypatch.setattr(client_module.time, "time", o.clock)
    answers = []
    for name in ("first", "second"):
        c = OrchestratorClient("http://testserver", o.worker(name))
        c.http = o.http  # the in-process app, signed with the orchestrator's clock
        answers.append(c.register({"role": "worker", "hardware": HW}))
    assert [a["stake"] for a in answers] == [o.cfg.orchestrator.stake] * 2
    assert slept == [1.0]  # the second waited for the faucet, as Retry-After said
