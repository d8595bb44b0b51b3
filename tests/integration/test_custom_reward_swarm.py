"""`task.reward` end to end: a local swarm graded by the example's own reward
function (examples/custom_reward/position_reward.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from swarmrl.protocol.rollouts import read_rollouts
from tests.integration.conftest import ROOT, read_metrics, swarm_cmd

EXAMPLE = ROOT / "examples" / "custom_reward"


@pytest.mark.slow  # 1 to 3 minutes; the default suite tests the pieces (tests/unit/test_custom_reward.py)
def test_a_swarm_trains_on_its_own_reward_function(tiny_model, tmp_path):
    """Every process imports the function from PYTHONPATH; the orchestrator pins it,
    workers score with it, the validator accepts their files, and the rewards in the
    files are the function's."""
    steps = 2
    env = {**os.environ, "PYTHONPATH": str(EXAMPLE)}
    cmd = swarm_cmd(
        tmp_path, tiny_model, f"trainer.steps={steps}", "task.reward=position_reward:score",
        "launcher.eval_problems=8",
    )  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run = tmp_path / "runs" / "tiny"
    assert [r["step"] for r in read_metrics(run)] == list(range(1, steps + 1))
    pin = "every node grades with position_reward:score, source "
    assert pin in (run / "logs" / "orchestrator.log").read_text()
    for name in ("validator-0", "worker-0", "worker-1"):
        log = (run / "logs" / f"{name}.log").read_text()
        assert "the task reward is position_reward:score" in log, name
    verdicts = [json.loads(x) for x in (run / "verdicts.jsonl").read_text().splitlines()]
    assert verdicts and all(v["accepted"] for v in verdicts), verdicts

    sys.path.insert(0, str(EXAMPLE))
    try:
        from position_reward import score
    finally:
        sys.path.remove(str(EXAMPLE))
    files = sorted((run / "store").rglob("*.parquet"))  # those the trainer has not purged
    assert files
    rewards = []
    for f in files:
        for r in read_rollouts(f.read_bytes()):
            answer = r["prompt"].removeprefix("Reverse the text: ")[::-1]
            row = {"verification_info": {"answer": answer}}
            assert r["task_reward"] == pytest.approx(score(r["prompt"], r["completion"], row))
            rewards.append(r["task_reward"])
    assert len(set(rewards)) > 1
