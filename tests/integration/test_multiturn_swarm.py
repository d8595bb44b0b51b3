"""A multi-turn run as a user starts it (configs/multiplication.toml): SmolLM2-135M-Instruct
with the calculator, a relay, a validator checking every file, an honest worker and two
workers that cheat on the environment's part. The honest trajectories hold tool spans
and are accepted; each cheater is rejected at the check that catches its cheat.

Slow (about 5 minutes here: six processes load SmolLM2 on two cores); the default suite
covers the same path with the tiny model and a test environment (tests/unit/test_multiturn.py),
since the tiny model never writes a call."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from tests.integration.conftest import ROOT, read_metrics

# the check each cheat must fail (sim/tool_cheats.py)
EXPECTED = {"forged-tool-result": "environment", "edited-after-tool": "sampling"}


@pytest.mark.slow
def test_multiturn_swarm_accepts_honest_trajectories_and_rejects_tool_cheats(tmp_path):
    steps = 2
    cheats = list(EXPECTED)
    cmd = [
        sys.executable, "-m", "swarmrl", "rl", "--config", str(ROOT / "configs" / "multiplication.toml"),
        "--cheaters", str(len(cheats)), "--cheats", ",".join(cheats),
        f"runs_dir={json.dumps(str(tmp_path / 'runs'))}", f"trainer.steps={steps}",
        "launcher.eval_problems=0", "validator.sample_rate=1.0",
        # every cheater gets work at once (entry is tested apart: test_orchestrator_entry.py,
        # the shares per address range in test_orchestrator_ranges.py)
        "orchestrator.register_work_bits=8", "orchestrator.probation_groups=64",
        "orchestrator.range_share=1",
        "worker.max_pending_groups=64",
    ]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1500)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run = tmp_path / "runs" / "multiplication"
    rows = read_metrics(run)
    assert [r["step"] for r in rows][-1] == steps, rows

    names = {p.read_text().strip(): p.parent.name for p in (run / "nodes").glob("*/node.pub")}
    verdicts = [json.loads(x) for x in (run / "verdicts.jsonl").read_text().splitlines()]
    by_node: dict[str, list[dict]] = {}
    for v in verdicts:
        by_node.setdefault(names[v["node"]], []).append(v)
    honest = by_node.get("worker-0", [])
    assert honest and all(v["accepted"] for v in honest), honest
    kinds = {f"cheater-{i}": k for i, k in enumerate(cheats)}
    judged = {n: vs for n, vs in by_node.items() if n in kinds}
    assert judged, f"no cheater was judged: {sorted(by_node)}"
    for name, vs in judged.items():
        assert {(v["accepted"], v["check"]) for v in vs} == {(False, EXPECTED[kinds[name]])}, (
            kinds[name],
            vs,
        )

    # the honest files the trainer used were trajectories with the tool's spans in them
    db = sqlite3.connect(run / "orchestrator" / "state.sqlite")
    states = dict(db.execute("SELECT key, state FROM files"))
    honest_keys = [v["key"] for v in honest]
    tool_tokens = 0
    for key in honest_keys:
        table = pq.read_table(run / "store" / key)
        assert table.schema.metadata[b"swarmrl.rollouts"] == b"2"
        masks = table.column("completion_mask").to_pylist()
        tool_tokens += sum(m.count(0) for m in masks)
    assert tool_tokens > 0, "no honest trajectory called the calculator"
    assert any(states[k] in ("consumed", "trained") for k in honest_keys), states
