"""Blameless refusals, counted against their node.

A file refused as `unverifiable`, at the validator's own `error` or by the trainer
blames no one, so a worker could send such files for nothing. Each is counted
against its node (`record_judgement`): once a worker's blameless refusals number
at least `blameless_min` and stand `blameless_factor` times above the swarm's rate,
it goes back to probation (every file validated, work from the probation pool and
its range's share; admission.py) and waits as after an expired assignment.

The swarm's rate is held between BLAMELESS_FLOOR and BLAMELESS_CEILING. The
ceiling is what keeps many keys from raising it together: were a swarm's nodes
mostly an attacker's, each sending blameless files, the swarm's own rate would
rise with theirs and none would stand out; against the ceiling each of them is
still past `blameless_factor` times it. An honest swarm refuses far fewer files
without blame (none in the emulated swarm's runs: docs/results.md). The counts
fade: a node's are halved each time it reaches JUDGED_WINDOW judged files, the
swarm's at SWARM_WINDOW, so the rates are recent ones. Where no validator runs,
only the trainer's refusals count.
"""

from __future__ import annotations

from swarmrl.orchestrator.admission import record_expiry
from swarmrl.orchestrator.service import Service

BLAMELESS_FLOOR = 0.01  # the swarm's blameless rate that a node's is compared with, at least
BLAMELESS_CEILING = 0.05  # ...and at most, whatever the swarm's nodes send
JUDGED_WINDOW = 100  # a node's counts are halved when it has this many judged files
SWARM_WINDOW = 10_000  # ...and the swarm's


def record_judgement(svc: Service, cur, node: str, blameless: bool, now: float) -> bool:
    """One more judged file of `node` (a validator's verdict, or the trainer's refusal);
    `blameless`: refused with no one blamed. True when that sends the node back to
    probation: blameless refusals at least `blameless_min` and above `blameless_factor`
    times the swarm's rate (held between BLAMELESS_FLOOR and BLAMELESS_CEILING). Its
    counts then start afresh."""
    o = svc.cfg.orchestrator
    cur.execute(
        "INSERT INTO standing (node, proven, expired, last_expired, judged, blameless)"
        " VALUES (?, 0, 0, 0, 1, ?) ON CONFLICT (node) DO UPDATE SET"
        " judged = standing.judged + 1, blameless = standing.blameless + excluded.blameless",
        (node, int(blameless)),
    )
    cur.execute(  # integer halves on both engines
        "UPDATE standing SET judged = judged / 2, blameless = blameless / 2"
        " WHERE node = ? AND judged >= ?",
        (node, JUDGED_WINDOW),
    )
    for name in ("judged_files", "blameless_files") if blameless else ("judged_files",):
        cur.execute(
            "INSERT INTO counters VALUES (?, 1) ON CONFLICT (name) DO UPDATE"
            " SET value = counters.value + 1",
            (name,),
        )
    if cur.execute(
        "SELECT 1 FROM counters WHERE name = 'judged_files' AND value >= ?", (SWARM_WINDOW,)
    ).fetchone():
        cur.execute(
            "UPDATE counters SET value = value / 2"
            " WHERE name IN ('judged_files', 'blameless_files')"
        )
    if not blameless or node in o.trusted_workers:
        return False
    judged, refused = cur.execute(
        "SELECT judged, blameless FROM standing WHERE node = ?", (node,)
    ).fetchone()
    swarm = dict(
        cur.execute(
            "SELECT name, value FROM counters WHERE name IN ('judged_files', 'blameless_files')"
        ).fetchall()
    )
    rate = swarm.get("blameless_files", 0) / max(1, swarm["judged_files"])
    rate = min(BLAMELESS_CEILING, max(BLAMELESS_FLOOR, rate))
    if refused < o.blameless_min or refused <= o.blameless_factor * rate * judged:
        return False
    cur.execute("UPDATE standing SET proven = 0, judged = 0, blameless = 0 WHERE node = ?", (node,))
    record_expiry(cur, node, now)
    cur.execute(
        "INSERT INTO events (time, node, kind, amount, detail) VALUES (?, ?, 'probation', 0, ?)",
        (now, node, f"{refused} of {judged} files refused without blame; the swarm's rate"
         f" is {rate:.3f}: back to probation"),
    )  # fmt: skip
    return True
