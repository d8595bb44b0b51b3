"""Admission: what a worker key gets before it has proved anything, and what holding
work without doing it costs.

A key is free and its hardware report is its own word, so a new worker starts on
probation until `orchestrator.probation_files` of its files were accepted by a
validator (every file once validation is off):

- each of its files is validated, whatever `validator.sample_rate` (a measured
  proof of compute with the run's model: a lazy or cheating key is caught before
  any of its files is trained on unchecked);
- all keys on probation together hold at most `orchestrator.probation_groups`
  groups (default: one step's worth, `trainer.batch_groups`, at least one
  file), apart from the capacity of proven workers. A flood of new keys
  competes for that pool only: it cannot take the work of proven workers. The
  pool comes on top of the run's capacity, so up to twice the groups the
  trainer needs may be out while new keys work (a file that comes too late
  goes stale). With a pool of one file, 2 honest newcomers among 8 hoarding
  keys made 14% of what they make alone (the admission test's simulation).
  (An assignment always holds `worker.groups_per_file` groups: workers and
  validators build and check files of that size.)

Keys the operator lists in `orchestrator.trusted_workers` (the launcher's own
workers) skip probation.

An assignment's deadline follows the node's speed, not a flat `assignment_s`:
`assignment_slack` times the time its reported speed needs for the file, within
[`min_assignment_s`, `assignment_s`]. A node whose assignment expires (or that
goes silent holding one, or submits after the deadline plus `late_grace_s`)
waits `min_assignment_s · 2^(k−1)` after its k-th lapse before it gets
another (at most `assignment_s`); each file on time takes one lapse off. A
node that reports no speed gets the shortest deadline. The operator's
`trusted_workers` get the flat `assignment_s` and no waits.

What this does not stop: an attacker with many keys still fills the probation
pool, delaying honest newcomers (not proven workers); a node that reports a
low speed gets long deadlines and may hold work that long; a node that
submits just before its deadline is not penalised (measured: 2 honest workers
keep 0.68 of the trained groups among 8 such keys); the stake is still a
ledger number. See docs/threat-model.md.
"""

from __future__ import annotations

import json

from swarmrl.orchestrator.service import Service


def proven(cur, node: str) -> int:
    row = cur.execute("SELECT proven FROM standing WHERE node = ?", (node,)).fetchone()
    return int(row[0]) if row else 0


def on_probation(svc: Service, cur, node: str) -> bool:
    o = svc.cfg.orchestrator
    if node in o.trusted_workers:
        return False
    return proven(cur, node) < o.probation_files


def record_proof(cur, node: str) -> None:
    """One more accepted file of `node` (a validator's acceptance, or any with validation off)."""
    cur.execute(
        "INSERT INTO standing VALUES (?, 1, 0, 0) ON CONFLICT (node) DO UPDATE"
        " SET proven = standing.proven + 1",
        (node,),
    )


def record_expiry(cur, node: str, now: float) -> None:
    """One more lapse of `node`: an assignment expired, abandoned, or submitted late."""
    cur.execute(
        "INSERT INTO standing VALUES (?, 0, 1, ?) ON CONFLICT (node) DO UPDATE"
        " SET expired = standing.expired + 1, last_expired = excluded.last_expired",
        (node, now),
    )


def cooldown_left(svc: Service, cur, node: str, now: float) -> float:
    """Seconds before `node` may take new work after letting assignments expire."""
    if node in svc.cfg.orchestrator.trusted_workers:
        return 0.0
    row = cur.execute(
        "SELECT expired, last_expired FROM standing WHERE node = ?", (node,)
    ).fetchone()
    if not row or not row[0]:
        return 0.0
    o = svc.cfg.orchestrator
    wait = min(o.assignment_s, o.min_assignment_s * 2.0 ** min(int(row[0]) - 1, 30))
    return max(0.0, float(row[1]) + wait - now)


def deadline_s(svc: Service, cur, node: str, groups: int, budget: int) -> float:
    """Seconds `node` gets for an assignment of `groups` groups at `budget` new tokens
    (the operator's trusted workers: `assignment_s`)."""
    o = svc.cfg.orchestrator
    if node in o.trusted_workers:
        return o.assignment_s
    needed = _generation_s(svc, cur, node, groups, budget)
    return min(o.assignment_s, max(o.min_assignment_s, o.assignment_slack * needed))


def check_turnaround(svc: Service, cur, node: str, counter: int, now: float) -> None:
    """A file submitted after its assignment's deadline plus `late_grace_s` counts as an
    expiry (the assignment may already be reissued); one on time takes one expiry off
    the node's count, so an honest node's old lapses fade."""
    row = cur.execute("SELECT deadline FROM assignments WHERE counter = ?", (counter,)).fetchone()
    if row is None or node in svc.cfg.orchestrator.trusted_workers:
        return
    if now > float(row[0]) + svc.cfg.orchestrator.late_grace_s:
        record_expiry(cur, node, now)
    else:
        cur.execute(
            "UPDATE standing SET expired = expired - 1 WHERE node = ? AND expired > 0", (node,)
        )


def _generation_s(svc: Service, cur, node: str, groups: int, budget: int) -> float:
    """Seconds the node's reported speed needs to generate `groups` groups (0 when it
    reports none: a node that does not say how fast it is gets the shortest deadline)."""
    row = cur.execute("SELECT hardware FROM nodes WHERE key = ?", (node,)).fetchone()
    tps = float(json.loads(row[0]).get("tokens_per_s", 0.0)) if row and row[0] else 0.0
    if tps <= 0.0:
        return 0.0
    return groups * svc.cfg.worker.group_size * budget / tps


def probation_limit(svc: Service) -> int:
    cfg = svc.cfg
    return cfg.orchestrator.probation_groups or max(
        cfg.trainer.batch_groups, cfg.worker.groups_per_file
    )


def outstanding(svc: Service, cur, oldest_policy: int, probation: bool) -> int:
    """Groups out (open assignments, files on their way with a fresh policy) of the
    nodes on probation (`probation`) or of the others."""
    o = svc.cfg.orchestrator
    trusted = list(o.trusted_workers)
    marks = ", ".join("?" for _ in trusted) or "''"
    # a node is on probation when it is not trusted and has fewer proofs than required
    cond = (
        f"COALESCE(n.proven, 0) < ? AND {{col}} NOT IN ({marks})"
        if probation
        else f"(COALESCE(n.proven, 0) >= ? OR {{col}} IN ({marks}))"
    )
    a = cur.execute(
        "SELECT COALESCE(SUM(a.groups), 0) FROM assignments a"
        " LEFT JOIN standing n ON n.node = a.node WHERE a.state = 'open' AND "
        + cond.format(col="a.node"),
        (o.probation_files, *trusted),
    ).fetchone()[0]
    f = cur.execute(
        "SELECT COALESCE(SUM(f.groups), 0) FROM files f LEFT JOIN standing n ON n.node = f.node"
        " WHERE f.state IN ('uploading', 'pending', 'accepted') AND f.void = 0"
        " AND f.policy >= ? AND " + cond.format(col="f.node"),
        (oldest_policy, o.probation_files, *trusted),
    ).fetchone()[0]
    return int(a) + int(f)
