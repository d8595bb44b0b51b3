"""The dashboard's API over a real orchestrator (in process): the trainer's rows and
the launcher's held-out scores, the swarm view, the verdicts, the files of a step and a
rollout read back from the object store, who may read the texts, and how long files
stay for the viewer."""

from __future__ import annotations

import dataclasses

from swarmrl.protocol.identity import public_key_hex
from swarmrl.protocol.rollouts import write_rollouts
from swarmrl.protocol.verdict import Verdict
from tests.unit.orch_util import Orch


def _rows(node: str, step: int, policy: int) -> list[dict]:
    return [
        {"problem_id": "p7", "group": 0, "prompt_tokens": [1, 2], "completion_tokens": [3, 4, 5],
         "completion_logprobs": [-0.1, -0.2, -0.3], "reward": r, "task_reward": r,
         "length_penalty": 0.0, "target_length": 0, "step": step, "policy_step": policy,
         "seed": 11, "temperature": 1.0, "top_p": 1.0, "proofs": b"", "node": node, "task_type": "reverse",
         "prompt": "reverse: abc <b>", "completion": text}
        for r, text in ((1.0, "cba"), (0.0, "<script>x</script>"))
    ]  # fmt: skip


def _file(o: Orch, w, step: int, policy: int, seed: int = 11) -> dict:
    a = o.assignment(w, policy)["assignment"]
    data = write_rollouts([r | {"seed": seed} for r in _rows(public_key_hex(w), step, policy)])
    return o.upload(w, a["counter"], data) | {"data": data}


def _judge(o: Orch, accepted: bool) -> dict:
    f = o.ok(o.validator, "POST", "/v1/validation/claim", {"max_policy": 99})["file"]
    v = Verdict(f["key"], f["sha256"], f["node"], f["assignment"]["step"],
                f["assignment"]["policy_step"], accepted, check="" if accepted else "proof",
                reason="" if accepted else "proof mismatch at token 2")  # fmt: skip
    body = {"verdict": dataclasses.asdict(v.signed(o.validator))}
    o.ok(o.validator, "POST", "/v1/validation/verdict", body)
    return f


def test_run_view_holds_the_trainer_rows_and_the_heldout_scores(tmp_path):
    o = Orch(tmp_path, "trainer.steps=10")
    for step in (1, 2, 3):
        row = {"step": step, "reward": 0.1 * step, "elapsed_s": 10.0 * step, "synced": False}
        o.ok(o.trainer, "POST", "/v1/trainer/metrics", {"step": step, "row": row})
    run = o.http.get("/v1/dashboard/run").json()
    assert [r["step"] for r in run["metrics"]] == [1, 2, 3]
    assert run["metrics"][2]["reward"] == 0.30000000000000004
    assert run["eta_s"] == 10.0 * 7  # 10 s a step, 7 steps left
    assert [r["step"] for r in o.http.get("/v1/dashboard/run?after=2").json()["metrics"]] == [3]
    # a row that is not flat numbers, or names outside [a-z0-9_], is refused
    bad = o.call(o.trainer, "POST", "/v1/trainer/metrics", {"step": 4, "row": {"R": 1}})
    assert bad.status_code == 422
    bad = o.call(o.trainer, "POST", "/v1/trainer/metrics", {"step": 4, "row": {"r": [1]}})
    assert bad.status_code == 422
    # the held-out scores are the operator's to post
    body = {"name": "start_model", "step": 0, "result": {"accuracy": 0.25, "mode": "greedy"}}
    assert o.http.post("/v1/admin/evaluations", json=body).status_code == 401
    auth = {"Authorization": f"Bearer {o.token}"}
    assert o.http.post("/v1/admin/evaluations", json=body, headers=auth).status_code == 200
    evals = o.http.get("/v1/dashboard/run").json()["evaluations"]
    assert evals[0]["name"] == "start_model" and evals[0]["accuracy"] == 0.25
    # a trainer resumed from version 2 drops the rows past it, as metrics.jsonl does
    o.open_step(3, 0)
    o.ok(o.trainer, "POST", "/v1/trainer/resume", {"version": 2})
    assert [r["step"] for r in o.http.get("/v1/dashboard/run").json()["metrics"]] == [1, 2]


def test_files_verdicts_and_rollouts_of_a_step(tmp_path):
    o = Orch(tmp_path)
    good, bad = o.worker("good"), o.worker("bad")
    o.register(good)
    o.register(bad)
    o.open_step(1, 0)
    f_good = _file(o, good, 1, 0)
    _judge(o, True)
    f_bad = _file(o, bad, 1, 0)
    _judge(o, False)
    files = o.http.get("/v1/dashboard/files").json()
    assert files["step"] == 1 and files["level"] == 0
    by_key = {f["key"]: f for f in files["files"]}
    assert by_key[f_good["key"]]["state"] == "accepted" and by_key[f_good["key"]]["staleness"] == 1
    assert by_key[f_bad["key"]]["check"] == "proof"
    verdicts = o.http.get("/v1/dashboard/verdicts").json()
    assert [v["accepted"] for v in verdicts["verdicts"]] == [True, False]
    assert verdicts["verdicts"][1]["reason"] == "proof mismatch at token 2"
    kinds = [(e["node"], e["kind"]) for e in verdicts["events"]]
    assert (public_key_hex(bad), "ejected") in kinds and (public_key_hex(bad), "slash") in kinds
    # the texts need the operator token, and come back as the worker wrote them
    path = "/v1/dashboard/files/" + f_good["key"]
    assert o.http.get(path).status_code == 401
    r = o.http.get(path, headers={"Authorization": f"Bearer {o.token}"}).json()
    assert [s["completion"] for s in r["samples"]] == ["cba", "<script>x</script>"]
    assert r["samples"][0]["prompt"] == "reverse: abc <b>" and r["samples"][0]["reward"] == 1.0
    assert "proofs" not in r["samples"][0] and r["state"] == "accepted"
    assert o.http.get("/v1/dashboard/files/nope", headers={"Authorization": f"Bearer {o.token}"}
                      ).status_code == 404  # fmt: skip


def test_public_rollouts_and_a_file_that_does_not_read(tmp_path):
    o = Orch(tmp_path, "orchestrator.public_rollouts=true")
    w = o.worker("w")
    o.register(w)
    o.open_step(1, 0)
    a = o.assignment(w, 0)["assignment"]
    g = o.upload(w, a["counter"], b"not parquet")
    r = o.http.get("/v1/dashboard/files/" + g["key"])
    assert r.status_code == 200 and "does not read as rollouts" in r.json()["gone"]


def test_swarm_view_has_each_node_version_and_weights_lag(tmp_path):
    o = Orch(tmp_path)
    w = o.worker("w")
    o.register(w, {"cpus": 4, "memory_gb": 16.0, "tokens_per_s": 80.0, "device": "cpu (4 threads)"})
    o.open_step(1, 0)
    o.assignment(w, 0)
    o.clock.t += 5.0
    o.ok(o.trainer, "POST", "/v1/trainer/published", {"version": 1})
    o.clock.t += 3.0
    node = o.http.get("/v1/dashboard/swarm").json()["nodes"][0]
    assert (node["version"], node["behind"], node["lag_s"]) == (0, 1, 3.0)
    assert (node["cpus"], node["tokens_per_s"], node["device"]) == (4, 80.0, "cpu (4 threads)")
    o.assignment(w, 1)
    view = o.http.get("/v1/dashboard/swarm").json()
    node = view["nodes"][0]
    assert (node["behind"], node["lag_s"]) == (0, 0.0)
    # `swarmrl status` prints the same node table
    from swarmrl.protocol.status import ledger_table

    table = ledger_table(view, now=o.clock()).splitlines()
    head = table.index(next(x for x in table if x.startswith("node ")))
    assert "hardware" in table[head] and "behind" in table[head]
    assert "4 cpu, 16 GB" in table[head + 1] and "0.0s" in table[head + 1]


def test_trained_files_stay_for_the_viewer_then_go(tmp_path):
    o = Orch(tmp_path, "orchestrator.keep_trained_steps=2")
    w = o.worker("w")
    o.register(w)
    o.open_step(1, 0)
    f = _file(o, w, 1, 0)
    _judge(o, True)
    o.ok(o.trainer, "POST", "/v1/trainer/consume", {"step": 1, "keys": [f["key"]]})
    o.ok(o.trainer, "POST", "/v1/trainer/published", {"version": 1})
    o.ok(o.trainer, "POST", "/v1/trainer/published", {"version": 2})
    assert o.svc.objects.size(f["key"]) == len(f["data"])
    o.ok(o.trainer, "POST", "/v1/trainer/published", {"version": 3})
    assert o.svc.objects.size(f["key"]) is None
    r = o.http.get(
        "/v1/dashboard/files/" + f["key"], headers={"Authorization": f"Bearer {o.token}"}
    )
    assert "deleted" in r.json()["gone"]


def test_a_lost_announce_and_a_resume_leave_no_trained_file_behind(tmp_path):
    """Deletion follows what was deleted, not the versions announced: version 4's announce
    is lost, the trainer resumes at 4, and the next version still deletes step 2's file."""
    # a file of step 2 at policy 0: the slack rule (work_slack_steps) would refuse it
    o = Orch(tmp_path, "orchestrator.keep_trained_steps=2", "orchestrator.work_slack_steps=0")
    w = o.worker("w")
    o.register(w)
    o.open_step(2, 0)
    f = _file(o, w, 2, 0)
    _judge(o, True)
    o.ok(o.trainer, "POST", "/v1/trainer/consume", {"step": 2, "keys": [f["key"]]})
    for version in (1, 2, 3):
        o.ok(o.trainer, "POST", "/v1/trainer/published", {"version": version})
    assert o.svc.objects.size(f["key"]) == len(f["data"])  # kept: 3 - 2 < 2
    o.ok(o.trainer, "POST", "/v1/trainer/resume", {"version": 4})  # 4 was never announced
    o.ok(o.trainer, "POST", "/v1/trainer/published", {"version": 5})
    assert o.svc.objects.size(f["key"]) is None


def test_rows_without_their_usual_fields_never_fail_a_read(tmp_path):
    """Whatever fields a writer's rows lack or mistype (a trainer row without `step` or
    `elapsed_s`, an evaluation naming its own `step`), every dashboard and ledger read
    answers 200, and the ETA is unknown rather than an error."""
    o = Orch(tmp_path, "trainer.steps=10")
    rows = [{"reward": 0.5}, {"elapsed_s": None}, {"elapsed_s": True}, {}, {"step": 2, "x": 1}]
    for step, row in enumerate(rows, 1):
        o.ok(o.trainer, "POST", "/v1/trainer/metrics", {"step": step, "row": row})
    auth = {"Authorization": f"Bearer {o.token}"}
    body = {"name": "start_model", "step": 0, "result": {"step": "three", "time": None}}
    assert o.http.post("/v1/admin/evaluations", json=body, headers=auth).status_code == 200
    o.open_step(1, 0)
    run = o.http.get("/v1/dashboard/run")
    assert run.status_code == 200, run.text
    assert run.json()["eta_s"] is None  # the first row has no elapsed_s
    assert [r["step"] for r in run.json()["metrics"]] == [1, 2, 3, 4, 5]  # the stored step
    assert run.json()["evaluations"][0]["step"] == 0
    for path in ("/v1/dashboard/swarm", "/v1/dashboard/verdicts", "/v1/dashboard/files",
                 "/v1/ledger", "/v1/admin/nodes"):  # fmt: skip
        assert o.http.get(path, headers=auth).status_code == 200, path
    # with elapsed times at both ends the ETA comes back
    o.ok(o.trainer, "POST", "/v1/trainer/metrics", {"step": 1, "row": {"elapsed_s": 10.0}})
    o.ok(o.trainer, "POST", "/v1/trainer/metrics", {"step": 5, "row": {"elapsed_s": 50.0}})
    assert o.http.get("/v1/dashboard/run").json()["eta_s"] == 50.0  # 10 s a step, 5 left


def test_the_swarm_view_counts_work_wasted_through_no_fault_of_its_worker(tmp_path):
    """Files that went stale count as wasted, over the files neither blamed nor voided:
    a file still on its way counts in the total only."""
    o = Orch(tmp_path)
    w = o.worker("w")
    o.register(w)
    o.open_step(1, 0)
    for seed in range(2):
        _file(o, w, 1, 0, seed)
    _judge(o, accepted=True)  # the first accepted, the second pending
    assert o.http.get("/v1/dashboard/swarm").json()["wasted"] == {
        "files": 2, "stale": 0, "refused_blamelessly": 0, "wasted_fraction": 0.0}  # fmt: skip
    o.open_step(4, 3)  # policy 0 is past async_level: both go stale
    _file(o, w, 4, 3)
    view = o.http.get("/v1/dashboard/swarm").json()
    assert view["nodes"][0]["stale"] == 2
    assert view["wasted"] == {"files": 3, "stale": 2, "refused_blamelessly": 0,
                              "wasted_fraction": 0.6667}  # fmt: skip


def test_a_blamed_or_voided_file_is_not_work_wasted():
    from swarmrl.orchestrator.dashboard import work_wasted

    zero = {"accepted": 0, "rejected": 0, "blameless": 0, "pending": 0, "stale": 0, "void": 0}
    nodes = [
        {**zero, "role": "worker", "accepted": 3, "rejected": 2, "blameless": 1, "void": 4},
        {**zero, "role": "worker", "stale": 1},
        {**zero, "role": "validator", "stale": 9},  # not a worker's work
    ]
    # 3 accepted + 1 refused without blame + 1 stale; the blamed one and the void out
    assert work_wasted(nodes) == {"files": 5, "stale": 1, "refused_blamelessly": 1,
                                  "wasted_fraction": 0.4}  # fmt: skip
