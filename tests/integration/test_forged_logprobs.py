"""A worker that forges its recorded log-probs on files no validator was drawn to
check: the trainer's importance correction bounds what its tokens weigh, the mismatch
it reports singles the node out, and the orchestrator sends the node's next files to
a validator, which rejects them."""

from __future__ import annotations

import json
import sqlite3
import subprocess

from swarmrl.protocol.assign import parse_rollout_key
from tests.integration.conftest import read_metrics, swarm_cmd


def test_forged_logprobs_are_bounded_flagged_and_then_validated(tiny_model, tmp_path):
    cmd = swarm_cmd(
        # 12 steps, so that the forger submits again after its flag; the mismatch window
        # holds all of them, so that the table still has its figures at the end
        tmp_path, tiny_model, "trainer.steps=12", "validator.sample_rate=1e-4",
        "validator.mismatch_window=16",
        "trainer.is_correction=\"token_tis\"", "trainer.is_cap=2.0",
    )  # fmt: skip
    cmd[4:4] = ["--cheaters", "1", "--cheats", "forged-logprobs"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run = tmp_path / "runs" / "tiny"
    names = {p.read_text().strip(): p.parent.name for p in (run / "nodes").glob("*/node.pub")}
    cheater = next(k for k, n in names.items() if n.startswith("cheater-"))
    db = sqlite3.connect(run / "orchestrator" / "state.sqlite")

    # flagged on the mismatch of its unchecked files, far above the honest nodes'
    row = db.execute("SELECT step, detail FROM suspects WHERE node = ?", (cheater,)).fetchone()
    events = db.execute("SELECT kind, detail FROM events WHERE node = ?", (cheater,)).fetchall()
    figures = db.execute("SELECT step, node, checked, tokens, kl FROM mismatch").fetchall()
    assert row is not None, (events, figures, res.stdout[-2000:])
    step, detail = row
    assert [n for (n,) in db.execute("SELECT node FROM suspects")] == [cheater]
    kl = dict(db.execute("SELECT node, MAX(kl) FROM mismatch WHERE checked = 0 GROUP BY node"))
    honest = [v for k, v in kl.items() if k != cheater]
    assert honest and kl[cheater] > 100 * max(honest), kl

    # while it went unchecked, the correction truncated its tokens' weights at C
    rows = read_metrics(run)
    trained = [r for r in rows if r["step"] <= step]
    assert max(r["is_excluded_fraction"] for r in trained) > 0.05, trained

    # after the flag, every file of it a validator judged, and rejected for its log-probs
    verdicts = [json.loads(x) for x in (run / "verdicts.jsonl").read_text().splitlines()]
    mine = [v for v in verdicts if v["node"] == cheater]
    assert mine and all(not v["accepted"] and v["check"] == "sampling" for v in mine), mine
    after = db.execute(
        "SELECT key, state FROM files WHERE node = ? AND state NOT IN ('consumed', 'trained')",
        (cheater,),
    ).fetchall()
    assert after, "no file of the cheater was held back after the flag"
    judged = {v["key"] for v in mine}
    for key, state in after:
        assert state in ("rejected", "stale", "pending", "void") or key in judged, (key, state)
    state, slashed = db.execute(
        "SELECT state, slashed FROM nodes WHERE key = ?", (cheater,)
    ).fetchone()
    assert state == "ejected" and slashed > 0
    assert parse_rollout_key(mine[0]["key"])["node"] == cheater
