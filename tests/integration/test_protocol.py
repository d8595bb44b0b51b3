"""The protocol end to end: a worker that has nothing but the orchestrator's URL,
and an orchestrator killed in the middle of a run."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import pytest

from swarmrl.launch.supervisor import free_port
from tests.integration.conftest import (
    at,
    kill,
    pid_of,
    read_metrics,
    swarm_cmd,
    wait_for,
)


def _nodes(run) -> dict:
    db = sqlite3.connect(run / "orchestrator" / "state.sqlite")
    try:
        return {k: s for k, s in db.execute("SELECT key, state FROM nodes")}
    finally:
        db.close()


def test_a_worker_with_only_the_url_joins_and_contributes(tiny_model, tmp_path):
    """The "other machine" test: the swarm runs without workers; a worker process
    started in an empty directory, given only the URL, joins and its files train."""
    steps = 4
    run = tmp_path / "runs" / "tiny"
    url = f"http://127.0.0.1:{free_port()}"
    swarm = subprocess.Popen(
        swarm_cmd(tmp_path, tiny_model, f"trainer.steps={steps}", "launcher.workers=0", *at(url)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWARMRL")}
    worker = None
    try:
        wait_for(lambda: (run / "logs" / "trainer.log").exists(), 120, "the trainer", swarm)
        worker = subprocess.Popen(
            [sys.executable, "-m", "swarmrl", "worker", "--orchestrator", url],
            cwd=elsewhere,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        out, err = swarm.communicate(timeout=600)
        worker_out, _ = worker.communicate(timeout=60)
    finally:
        for p in (swarm, worker):
            if p is not None and p.poll() is None:
                p.kill()
    assert swarm.returncode == 0, err[-3000:]
    assert worker.returncode == 0, worker_out[-3000:]
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    assert sum(r["accepted_files"] for r in rows) >= steps
    key = (elsewhere / "swarmrl-worker" / "node.pub").read_text().strip()
    assert oct((elsewhere / "swarmrl-worker" / "node.key").stat().st_mode & 0o777) == "0o600"
    db = sqlite3.connect(run / "orchestrator" / "state.sqlite")
    trained = db.execute(
        "SELECT COUNT(*) FROM files WHERE node = ? AND state IN ('consumed', 'trained')", (key,)
    ).fetchone()[0]
    assert trained == sum(r["accepted_files"] for r in rows)  # every trained file is its
    assert "registered: stake 100.0" in worker_out
    # one file made the whole way before registering (worker.warm_up), never uploaded:
    # files.jsonl records the files of assignments only
    assert worker_out.index("warmed up on a file of one group") < worker_out.index(
        "registered: stake"
    )
    log = [json.loads(x) for x in (elsewhere / "swarmrl-worker" / "files.jsonl").open()]
    made = [x for x in log if x["event"] == "made"]
    assert made and all(x["counter"] > 0 for x in made)


@pytest.mark.slow  # 40 s; in the default suite: the orchestrator's state across a
# restart (test_orchestrator_ledger.py, Orch.restart); end to end with SIGKILL in a
# 35-node swarm: test_emulated_swarm.py and bench/swarm_scale.py (both slow)
def test_orchestrator_killed_mid_run_loses_and_repeats_nothing(tiny_model, tmp_path):
    steps = 8
    run = tmp_path / "runs" / "tiny"
    url = f"http://127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        swarm_cmd(tmp_path, tiny_model, f"trainer.steps={steps}", *at(url)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: len(read_metrics(run)) >= 3, 300, "step 3", proc)
        kill(wait_for(lambda: pid_of(run, "orchestrator"), 10, "the orchestrator pid"))
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "process 'orchestrator' exited with code -9; restarting" in out
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    db = sqlite3.connect(run / "orchestrator" / "state.sqlite")
    used = db.execute(
        "SELECT key, consumed_step FROM files WHERE state IN ('consumed', 'trained')"
    ).fetchall()
    assert len(used) == sum(r["accepted_files"] for r in rows)  # each file trained once
    per_step = {}
    for _, step in used:
        per_step[step] = per_step.get(step, 0) + 1
    assert per_step == {r["step"]: r["accepted_files"] for r in rows if r["accepted_files"]}
    # the nodes re-attached: both workers still healthy members at the end
    workers = [(run / "nodes" / f"worker-{i}" / "node.pub").read_text().strip() for i in (0, 1)]
    states = _nodes(run)
    assert all(states[w] in ("healthy", "unhealthy", "registered") for w in workers), states
